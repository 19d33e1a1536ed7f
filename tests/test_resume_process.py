"""Kill-and-resume: a process killed after k batches, resumed from its saved state in a new process, yields
exactly the batches the uninterrupted run yields from there, tensor by tensor."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import write_images

WORKER = Path(__file__).with_name("resume_worker.py")


def run(*args, timeout=240):
    return subprocess.run([sys.executable, str(WORKER), *map(str, args)], check=True, timeout=timeout,
                          capture_output=True, text=True, cwd=WORKER.parent)


def batches(folder: Path) -> dict[int, dict]:
    return {int(p.stem.split("_")[1]): torch.load(p) for p in sorted(folder.glob("batch_*.pt"))}


@pytest.mark.slow
@pytest.mark.parametrize("stop_after", [3, 7])  # mid-epoch, and across the epoch boundary
def test_killed_run_resumes_exactly(tmp_path, stop_after):
    data = tmp_path / "data"
    write_images(data, 21, classes=2, seed=8)
    (data / "class_1" / "img_0009.jpg").write_bytes(b"broken")  # a skip inside the run
    run(data, tmp_path / "whole")
    whole = batches(tmp_path / "whole")

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(WORKER), str(data), str(killed), "--stop-after", str(stop_after)],
                            cwd=WORKER.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (killed / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "worker ended before reaching the stop"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    run(data, killed, "--resume", killed / "state.pt")
    resumed = batches(killed)
    assert sorted(resumed) == sorted(whole)
    for k in whole:
        assert torch.equal(whole[k]["index"], resumed[k]["index"]), k
        assert torch.equal(whole[k]["image"], resumed[k]["image"]), k
