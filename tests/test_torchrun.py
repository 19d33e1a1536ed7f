"""Two ranks under torchrun (gloo, CPU): per epoch the union of what the ranks deliver is the dataset exactly
once, padding marked; the same with on_error="skip" and a bad file in one rank's shard."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_images

WORKER = Path(__file__).with_name("dist_worker.py")


def torchrun(data, out, last_batch, on_error):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
           str(data), str(out), last_batch, on_error]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=WORKER.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("last_batch", ["pad", "partial"])
@pytest.mark.parametrize("with_bad_file", [False, True])
def test_two_ranks_cover_the_dataset_exactly_once(tmp_path, last_batch, with_bad_file):
    data = tmp_path / "data"
    write_images(data, 13, classes=2, seed=5)
    bad = None
    if with_bad_file:
        bad = data / "class_0" / "img_0004.jpg"
        bad.write_bytes(b"\xff\xd8 not really")
    ranks = torchrun(data, tmp_path, last_batch, "skip" if with_bad_file else "raise")
    assert [r["world_size"] for r in ranks] == [2, 2]
    paths = sorted(str(p) for p in data.rglob("*.jpg"))
    good = {i for i, p in enumerate(paths) if str(p) != str(bad)}
    for epoch in range(2):
        valid = [i for r in ranks for i, ok in r["epochs"][epoch] if ok]
        assert sorted(valid) == sorted(good), (epoch, sorted(valid))
        if last_batch == "pad" and not with_bad_file:
            assert len(ranks[0]["epochs"][epoch]) == len(ranks[1]["epochs"][epoch])
    if with_bad_file:
        # with "pad" the bad file may also be another rank's padding repeat, and is skipped there too
        assert {w for r in ranks for w in r["skipped"]} == {str(bad)}
