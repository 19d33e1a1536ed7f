"""benchmarks/gpu_check.py: one valid JSON document, with or without a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from test_ops_emulated_gpu import gpu, kernels  # noqa: F401  (fixtures: kernels run on the CPU)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prints_one_json_document_and_exits_zero():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["gpu"] in (True, False)
    assert "scheduler" in doc
    if doc["gpu"]:
        assert doc["all_bit_identical"], doc["kernels"]
    else:
        assert doc["reason"]


def test_loads_ops_from_the_tree_without_an_installed_package():
    code = (
        "import sys, importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('gc', {str(SCRIPT)!r})\n"
        "gc = importlib.util.module_from_spec(spec); spec.loader.exec_module(gc)\n"
        "sys.modules.pop('feedline', None)\n"
        "ops = gc.load_from_tree(gc.ROOT, 'ops')\n"
        "import numpy as np\n"
        "assert ops.__file__ == str(gc.ROOT / 'ops' / '__init__.py'), ops.__file__\n"
        "assert ops.murmur3_32(np.array([10])).tolist() == [4004982076]\n"
        "assert 'nvidia.dali' not in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_kernel_checks_pass_on_emulated_gpu(gpu):  # noqa: F811
    from feedline import ops

    check = load_script()
    results = check.kernel_checks(ops, copy_bps=1e9, scale=0.002)
    assert len(results) == 14
    for name, entry in results.items():
        assert entry.get("bit_identical") is True, (name, entry)
        assert entry["keys_per_s"] > 0
    json.dumps(results)


def test_scheduler_section_records_costs_and_a_decision():
    section = load_script().scheduler_section(rows=20_000, batch_size=2048)
    stages = [c["stage"] for c in section["costs"]]
    assert stages[0] == "parse" and "hash" in stages
    assert all(c["cpu_s_per_sample"] > 0 for c in section["costs"])
    decision = section["decision"]
    assert [s["stage"] for s in decision["stages"]] == stages
    assert decision["history"][0]["reason"] == "initial plan"
    if section["device"] == "cpu":
        assert decision["placement"] == "cpu" and all(c["gpu_s_per_sample"] is None for c in section["costs"])

