"""GPU tests cannot rot unseen: every parametrisation of every test marked ``gpu`` is collected here, on the
CPU, and what it names is checked against what the GPU test would build: placements and cuts against the
pipeline the test declares (``@pytest.mark.gpu(pipeline=builder, placements=[...])``, ``builder(image_dir)``
returns the pipeline definition), and devices. A GPU test with a placement, cut or stage parameter must
declare its pipeline. Other parameters (dtypes, sizes, seeds) are data the test's CPU twin also runs on."""
import importlib
import itertools
from pathlib import Path

import pytest
import torch

from feedline.loader.placement import resolve

from test_loader import val_uint8

TESTS = Path(__file__).parent
NAMING_THE_PIPELINE = ("placement", "cut", "stage")
PARAMETER_SET = type(pytest.param(None))


def _gpu_mark(marks):
    return next((m for m in marks if m.name == "gpu"), None)


def _marks(obj) -> list:
    marks = getattr(obj, "pytestmark", [])
    return marks if isinstance(marks, list) else [marks]


def parametrisations(function) -> list[tuple[dict, bool]]:
    """Every parameter set pytest makes for ``function`` (stacked ``parametrize`` marks multiply), each with
    whether a ``gpu`` mark sits on it (``pytest.param(..., marks=pytest.mark.gpu)``)."""
    sets = [({}, False)]
    for mark in reversed([m for m in _marks(function) if m.name == "parametrize"]):
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for value in values:
            on_gpu = False
            if isinstance(value, PARAMETER_SET):
                on_gpu, value = _gpu_mark(value.marks) is not None, value.values
            elif len(names) == 1:
                value = (value,)
            rows.append((dict(zip(names, value)), on_gpu))
        sets = [({**a, **b}, ga or gb) for (a, ga), (b, gb) in itertools.product(sets, rows)]
    return sets


def gpu_cases():
    """(test id, the gpu mark, parameters) of every GPU test case in tests/."""
    for path in sorted(TESTS.glob("test_*.py")):
        if "mark.gpu" not in path.read_text():
            continue
        module = importlib.import_module(path.stem)
        module_mark = _gpu_mark(_marks(module))
        for name, function in vars(module).items():
            if not (name.startswith("test_") and callable(function)):
                continue
            mark = _gpu_mark(_marks(function)) or module_mark
            for params, param_on_gpu in parametrisations(function):
                if mark is not None or param_on_gpu:
                    yield f"{path.stem}::{name}{params or ''}", mark, params


def problems_of(where: str, mark, params: dict, data) -> list[str]:
    """What the GPU case names that the CPU-side validation refuses."""
    kwargs = mark.kwargs if mark is not None else {}
    placements = [("placement", p) for p in kwargs.get("placements", [])] + list(params.items())
    if "pipeline" not in kwargs:
        named = [k for k, _ in placements if k in NAMING_THE_PIPELINE]
        return [f"{where}: names {named} but its gpu mark declares no pipeline=..."] if named else []
    try:
        spec = kwargs["pipeline"](data)
    except Exception as e:
        return [f"{where}: its declared pipeline does not build: {type(e).__name__}: {e}"]
    found = []
    for name, value in placements:
        try:
            if name == "placement":
                resolve(spec, value, True)
            elif name == "cut" and value not in spec.valid_cuts():
                raise ValueError(f"cut {value} is not one of {spec.valid_cuts()}")
            elif name == "stage":
                spec.stage(value)
            elif name == "device" and torch.device(value).type != "cuda":
                raise ValueError(f"a GPU case on device {value!r}")
        except (ValueError, TypeError, KeyError, RuntimeError) as e:
            found.append(f"{where}: {name}={value!r}: {e}")
    return found


def test_every_gpu_case_names_what_its_pipeline_has(image_dir):
    cases = list(gpu_cases())
    problems = [p for where, mark, params in cases for p in problems_of(where, mark, params, image_dir)]
    assert problems == [], "\n".join(problems)
    checked = {where for where, _, params in cases}
    # The collection finds the GPU cases that name placements and devices (so this check cannot pass empty).
    assert sum(w.startswith("test_loader::test_gpu_placements_equal_cpu") for w in checked) == 3
    assert sum(w.startswith("test_image_color_stages::") and "'cuda'" in w for w in checked) == 12
    assert any(w.startswith("test_background::") for w in checked)


@pytest.mark.parametrize("mark,params,match", [
    (pytest.mark.gpu(pipeline=val_uint8).mark, {"placement": {"random_resized_crop": "gpu"}},
     "does not have"),
    (pytest.mark.gpu(pipeline=val_uint8).mark, {"placement": {"normalize": "gpu"}}, "does not have"),
    (pytest.mark.gpu(pipeline=val_uint8).mark, {"cut": 0}, "not one of"),
    (pytest.mark.gpu(pipeline=val_uint8, placements=["gpu-ish"]).mark, {}, "placement must be one of"),
    (pytest.mark.gpu.mark, {"placement": "gpu"}, "declares no pipeline"),
    (pytest.mark.gpu(pipeline=val_uint8).mark, {"device": "cpu"}, "GPU case on device"),
])
def test_the_check_refuses_what_a_gpu_test_could_not_build(image_dir, mark, params, match):
    """The stage names that sat in test_loader's GPU test (image.val has no random_resized_crop or normalize
    with uint8 output), a cut the pipeline does not allow, an unknown placement, an undeclared pipeline."""
    problems = problems_of("case", mark, params, image_dir)
    assert len(problems) == 1 and match in problems[0], problems


def test_stacked_and_marked_parametrisations_are_all_collected():
    @pytest.mark.parametrize("a", [1, pytest.param(2, marks=pytest.mark.gpu)])
    @pytest.mark.parametrize("b,c", [(3, 4), (5, 6)])
    def case(a, b, c):
        pass

    assert sorted((p["a"], p["b"], p["c"], g) for p, g in parametrisations(case)) == [
        (1, 3, 4, False), (1, 5, 6, False), (2, 3, 4, True), (2, 5, 6, True)]
