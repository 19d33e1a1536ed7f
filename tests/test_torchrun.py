"""Two ranks under torchrun (gloo, CPU), each step followed by an all_reduce as in DDP: per epoch every rank
yields exactly len(loader) batches and the union of what the ranks mark valid is the dataset exactly once;
the same with on_error="skip" and a bad file in one rank's shard, for every last_batch policy."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from feedline.loader.sampler import EpochSampler

from conftest import write_images

WORKER = Path(__file__).with_name("dist_worker.py")


def torchrun(data, out, last_batch, on_error):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
           str(data), str(out), last_batch, on_error]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=WORKER.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("last_batch", ["pad", "partial", "drop"])
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
    samples_per_rank = {"pad": 9, "partial": 7, "drop": 6}[last_batch]  # 13 samples, 2 ranks, batches of 3
    for r in ranks:
        assert r["len"] == -(-samples_per_rank // 3) and r["batches"] == [r["len"]] * 2
    for epoch in range(2):
        assert [len(r["epochs"][epoch]) for r in ranks] == [samples_per_rank] * 2
        valid = [i for r in ranks for i, ok in r["epochs"][epoch] if ok]
        assert len(valid) == len(set(valid))
        planned = set(range(13))
        if last_batch == "drop":  # the epoch's tail is not delivered: only the samples the shards hold
            planned = {i for rank in range(2) for p in EpochSampler(13, 3, seed=4, rank=rank, world_size=2,
                                                                     last_batch="drop").epoch(epoch)
                       for i in p.indices.tolist()}
        assert sorted(valid) == sorted(planned & good), (epoch, sorted(valid))
    if with_bad_file:
        # with "pad" the bad file may also be another rank's padding repeat, and is skipped there too; with
        # "drop" it is skipped where a shard holds it
        met = any(paths.index(str(bad)) in {i for p in EpochSampler(13, 3, seed=4, rank=rank, world_size=2,
                                                                      last_batch=last_batch).epoch(e)
                                             for i in p.indices.tolist()} for rank in range(2) for e in range(2))
        assert {w for r in ranks for w in r["skipped"]} == ({str(bad)} if met else set())
