"""The GPU tests' guard (gpu_guard.py, wired in by conftest): a ``gpu`` test is skipped only where there is no
GPU, with the reason shown; where a GPU is, a torch that cannot use it fails the test, even one that still
carries an old ``skipif(not torch.cuda.is_available())``."""
import os
import subprocess
import sys
from pathlib import Path

import torch

import conftest
import gpu_guard

TESTS = Path(__file__).parent

DEMO = '''
import pytest
import torch

@pytest.mark.gpu
def test_plain():
    pass

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="an old guard: no CUDA")
def test_old_guard():
    pass
'''


def run_demo(tmp_path, gpus: tuple, torch_problem) -> str:
    """pytest on the demo tests with gpu_guard as the plugin, on a machine that looks as given."""
    (tmp_path / "conftest.py").write_text(
        "import gpu_guard\n"
        "from gpu_guard import pytest_runtest_setup  # noqa: F401\n"
        f"gpu_guard.visible_gpus = lambda: {gpus!r}\n"
        f"gpu_guard.torch_cuda_problem = lambda: {torch_problem!r}\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'gpu: needs a GPU')\n")
    (tmp_path / "test_demo.py").write_text(DEMO)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "--strict-markers", "-p", "no:cacheprovider",
                           str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(TESTS)}, cwd=tmp_path)
    return done.stdout + done.stderr


def test_no_gpu_skips_with_the_reason(tmp_path):
    out = run_demo(tmp_path, (0, "no NVIDIA GPU: no /dev/nvidiaN device file"), None)
    assert "2 skipped" in out and "needs a GPU; no NVIDIA GPU: no /dev/nvidiaN device file" in out, out


def test_a_gpu_that_torch_cannot_use_fails_loudly(tmp_path):
    out = run_demo(tmp_path, (1, "NVML sees 1 GPU(s)"), "torch.cuda.is_available() is False")
    assert "2 error" in out and "skipped" not in out, out
    assert "a GPU test cannot run on this GPU machine: torch.cuda.is_available() is False" in out


def test_a_working_gpu_runs_the_tests(tmp_path):
    out = run_demo(tmp_path, (1, "NVML sees 1 GPU(s)"), None)
    assert ("2 passed" if torch.cuda.is_available() else "1 passed, 1 skipped") in out, out


def test_hidden_gpus_count_as_none(monkeypatch):
    gpu_guard.visible_gpus.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    try:
        assert gpu_guard.visible_gpus() == (0, "CUDA_VISIBLE_DEVICES='' hides every GPU")
    finally:
        gpu_guard.visible_gpus.cache_clear()


def test_this_machine_is_read_without_torch_or_cupy():
    count, how = gpu_guard.visible_gpus()
    assert isinstance(count, int) and count >= 0 and how
    if count == 0:  # then CuPy is only handed out if it imports, and never raises
        module = gpu_guard.cupy_where_gpu()
        assert module is None or module.__name__ == "cupy"
    else:
        assert gpu_guard.torch_cuda_problem() is None, "a GPU machine whose torch cannot use the GPU"


def test_the_suite_uses_the_guard():
    assert conftest.pytest_runtest_setup is gpu_guard.pytest_runtest_setup
