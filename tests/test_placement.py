"""Placements an image or feature pipeline allows, and the DALI device of every node, checked before any build."""
import pytest

from feedline.loader import dali_graph
from feedline.loader.errors import PlacementError
from feedline.loader.placement import resolve
from feedline.pipelines import image
from feedline.pipelines.spec import PipelineSpec
from feedline.pipelines.stage import Backend, Stage


@pytest.fixture(params=["train", "val"])
def spec(request, image_dir):
    return getattr(image, request.param)(image_dir)


def test_every_cut_is_a_single_cpu_to_gpu_cut(spec):
    assert spec.valid_cuts() == [1, 2, 3, 4]
    for cut in spec.valid_cuts():
        backends = list(spec.backends_at(cut).values())
        assert backends == [Backend.CPU] * cut + [Backend.GPU] * (4 - cut)


def test_engine_of_every_stage_for_each_placement(spec):
    host = spec.stages[0].name
    expected = {
        1: {host: "host", "decode": "dali:mixed", "resize": "dali:gpu", "normalize": "dali:gpu"},
        2: {host: "host", "decode": "dali:cpu", "resize": "dali:gpu", "normalize": "dali:gpu"},
        3: {host: "host", "decode": "dali:cpu", "resize": "torch:cpu", "normalize": "torch:cuda"},
        4: {host: "host", "decode": "dali:cpu", "resize": "torch:cpu", "normalize": "torch:cpu"},
    }
    for cut, engines in expected.items():
        assert dali_graph.engines(spec, cut) == engines


def test_dali_inputs_follow_the_placement(spec):
    tail_in_dali = {1: True, 2: True, 3: False, 4: False}
    for cut, in_dali in tail_in_dali.items():
        names = set(dali_graph.inputs(spec, cut))
        assert "encoded" in names
        if spec.name == "image-train":
            assert {"anchor", "shape"} <= names and ("flip" in names) == in_dali
        else:
            assert ({"resize_w", "resize_h", "crop_anchor"} <= names) == in_dali


def test_named_placements(spec):
    assert resolve(spec, "cpu", gpu_available=False) == 4
    assert resolve(spec, "auto", gpu_available=False) == 4
    assert resolve(spec, "auto", gpu_available=True) == 1
    assert resolve(spec, "gpu", gpu_available=True) == 1
    with pytest.raises(PlacementError, match="needs a CUDA GPU"):
        resolve(spec, "gpu", gpu_available=False)


def test_mappings(spec):
    assert resolve(spec, {"resize": "gpu"}, gpu_available=True) == 2
    assert resolve(spec, {"decode": "cpu", "normalize": "gpu"}, gpu_available=True) == 3
    assert resolve(spec, {"decode": "cpu"}, gpu_available=False) == 4
    with pytest.raises(ValueError, match="cannot return from the GPU"):
        resolve(spec, {"decode": "gpu", "resize": "cpu"}, gpu_available=True)
    with pytest.raises(ValueError, match="no stage|does not have"):
        resolve(spec, {"crop": "gpu"}, gpu_available=True)
    with pytest.raises(ValueError, match="'cpu' or 'gpu'"):
        resolve(spec, {"decode": "tpu"}, gpu_available=True)
    with pytest.raises(PlacementError, match="no usable CUDA GPU"):
        resolve(spec, {"decode": "gpu"}, gpu_available=False)


def test_cpu_only_stage_cannot_go_to_gpu(spec):
    host = spec.stages[0].name
    with pytest.raises(ValueError, match=host):
        resolve(spec, {host: "gpu"}, gpu_available=True)


@pytest.mark.parametrize("bad", ["GPU!", "fast", ""])
def test_unknown_names(spec, bad):
    with pytest.raises(ValueError, match="placement must be one of"):
        resolve(spec, bad, gpu_available=True)
    with pytest.raises(TypeError, match="placement must be"):
        resolve(spec, 1, gpu_available=True)


class Src:
    produces = ("x",)


def test_spec_checks_data_flow():
    with pytest.raises(ValueError, match="consumes"):
        PipelineSpec("p", Src(), (Stage("a", ("y",), ("z",)),), ("z",))
    with pytest.raises(ValueError, match="never produced"):
        PipelineSpec("p", Src(), (Stage("a", ("x",), ("z",)),), ("w",))
    with pytest.raises(ValueError, match="repeat"):
        PipelineSpec("p", Src(), (Stage("a", ("x",), ("z",)), Stage("a", ("z",), ("w",))), ("w",))
