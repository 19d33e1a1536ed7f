"""Placements an image or feature pipeline allows, and the DALI device of every node, checked before any build."""
import re

import pytest

from feedline.loader.runners import image_graph
from feedline.loader.errors import PlacementError
from feedline.loader.placement import resolve
from feedline.pipelines import image
from feedline.pipelines.image_params import StageParams
from feedline.pipelines.spec import PipelineSpec
from feedline.pipelines.stage import Backend, PlainStage


@pytest.fixture(params=["train", "val"])
def spec(request, image_dir):
    return getattr(image, request.param)(image_dir)


def _brighten(images):
    return images


COMPOSED = [image.decode(roi=True), image.random_resized_crop(64), image.horizontal_flip(),
            image.color_jitter(0.4, 0.4, 0.4, 0.1), image.custom(_brighten, backends="gpu"), image.normalize()]


def test_every_cut_is_a_single_cpu_to_gpu_cut(spec):
    assert spec.valid_cuts() == [1, 2, 3, 4, 5]
    for cut in spec.valid_cuts():
        backends = list(spec.backends_at(cut).values())
        assert backends == [Backend.CPU] * cut + [Backend.GPU] * (5 - cut)


# The engine of every stage of image.train for each cut: DALI decodes, on the GPU DALI keeps going for the
# stages that have a DALI implementation, on the CPU torch runs the rest.
TRAIN_ENGINES = {
    1: ("dali:mixed", "dali:gpu", "dali:gpu", "dali:gpu"),
    2: ("dali:cpu", "dali:gpu", "dali:gpu", "dali:gpu"),
    3: ("dali:cpu", "torch:cpu", "torch:cuda", "torch:cuda"),
    4: ("dali:cpu", "torch:cpu", "torch:cpu", "torch:cuda"),
    5: ("dali:cpu", "torch:cpu", "torch:cpu", "torch:cpu"),
}


def _graph(spec, cut):
    return image_graph.assign_engines(spec, cut, image.infer_types(spec.stages[1:]))


def test_engine_of_every_stage_for_each_placement(image_dir):
    spec = image.train(image_dir)
    for cut, engines in TRAIN_ENGINES.items():
        assert _graph(spec, cut).engines == {"read": "host", **dict(zip([s.name for s in spec.stages[1:]], engines))}


def test_a_stage_without_dali_leaves_dali_and_the_rest_runs_as_torch(image_dir):
    spec = image.pipeline(image_dir, COMPOSED)
    assert spec.valid_cuts() == [1, 2, 3, 4, 5]  # the custom stage runs on the GPU only
    graph = _graph(spec, 1)
    assert list(graph.engines.values()) == ["host", "dali:mixed", "dali:gpu", "dali:gpu", "torch:cuda",
                                            "torch:cuda", "torch:cuda"]
    assert graph.in_dali == 3 and all(step.batched for step in graph.torch_steps)
    graph = _graph(spec, 5)
    assert list(graph.engines.values()) == ["host", "dali:cpu", "torch:cpu", "torch:cpu", "torch:cpu",
                                            "torch:cuda", "torch:cuda"]
    assert [(s.gpu, s.batched) for s in graph.torch_steps] == [(False, False)] * 3 + [(True, True)] * 2


def _operator(op):
    """(DALI operator, the device it runs on) of an operator in a defined graph, read from its public ``spec``,
    whose text opens ``OpSpec for <module>__<Operator>:`` and holds the ``device`` argument."""
    text = str(op.spec)
    name = re.match(r"OpSpec for (\S+):", text).group(1).rsplit("__", 1)[-1]
    return name, re.search(r"^\s*device: (\S+)$", text, re.MULTILINE).group(1)


def _walk(node):
    """The chain of operators that make ``node``, following each one's first input: (DALI operator, the
    device it runs on), from the output back to the external source."""
    chain = []
    while True:
        op = node.source
        chain.append(_operator(op))
        if not op.inputs:
            return chain
        node = op.inputs[0]


# The DALI operators each stage becomes (random_resized_crop's crop is taken by the region-of-interest decoder).
DALI_OPS = {"decode": ["ImageSlice"], "decode/full": ["Image"], "random_resized_crop": ["Resize"], "resize": ["Resize"],
            "center_crop": ["Slice"], "horizontal_flip": ["Flip"], "normalize": ["CropMirrorNormalize"]}


@pytest.mark.parametrize("recipe", ["train", "val", "composed"])
@pytest.mark.parametrize("cut", [1, 2, 3, 4, 5])
def test_the_dali_graph_of_every_cut(image_dir, recipe, cut):
    """The real DALI graph is defined (not built: that needs CUDA for GPU placements), and its operators and
    their devices are what the placement says: the decoder on the CPU or ``mixed``, then the stages DALI runs
    on the GPU, in order."""
    from nvidia.dali import Pipeline

    spec = {"train": image.train, "val": image.val, "composed": lambda d: image.pipeline(d, COMPOSED)}[recipe](image_dir)
    graph = _graph(spec, cut)
    names = image_graph.feed_names(graph, StageParams(graph.stages).example())
    with Pipeline(batch_size=4, num_threads=1, device_id=None):
        chain = list(reversed(_walk(image_graph.define(graph, names, lambda: None))))
    in_dali = [s for s in spec.stages[1:] if graph.engines[s.name].startswith("dali")]
    expected = [("ExternalSource", "cpu")]
    for stage in in_dali:
        key = stage.name if stage.name != "decode" or stage.roi else "decode/full"
        device = "cpu" if graph.engines[stage.name] == "dali:cpu" else \
            "mixed" if graph.engines[stage.name] == "dali:mixed" else "gpu"
        expected += [(op, device) for op in DALI_OPS[key]]
    assert chain == expected
    assert (cut == 1) == (chain[1][1] == "mixed") and (cut <= 2) == (len(in_dali) > 1)


def test_named_placements(spec):
    assert resolve(spec, "cpu", gpu_available=False) == 5
    assert resolve(spec, "auto", gpu_available=False) == 5
    assert resolve(spec, "auto", gpu_available=True) == 1
    assert resolve(spec, "gpu", gpu_available=True) == 1
    with pytest.raises(PlacementError, match="needs a CUDA GPU"):
        resolve(spec, "gpu", gpu_available=False)


def test_mappings(spec):
    second = spec.stages[2].name  # random_resized_crop or resize
    assert resolve(spec, {second: "gpu"}, gpu_available=True) == 2
    assert resolve(spec, {"decode": "cpu", "normalize": "gpu"}, gpu_available=True) == 4
    assert resolve(spec, {"decode": "cpu"}, gpu_available=False) == 5
    with pytest.raises(ValueError, match="cannot return from the GPU"):
        resolve(spec, {"decode": "gpu", second: "cpu"}, gpu_available=True)
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
        PipelineSpec("p", Src(), (PlainStage("a", ("y",), ("z",)),), ("z",))
    with pytest.raises(ValueError, match="never produced"):
        PipelineSpec("p", Src(), (PlainStage("a", ("x",), ("z",)),), ("w",))
    with pytest.raises(ValueError, match="repeat"):
        PipelineSpec("p", Src(), (PlainStage("a", ("x",), ("z",)), PlainStage("a", ("z",), ("w",))), ("w",))


def test_the_readme_shows_the_generated_placement_tables(image_dir):
    from pathlib import Path

    from feedline.loader.placement.report import stage_table

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for recipe in (image.train, image.val):
        assert stage_table(recipe(image_dir)) in readme
