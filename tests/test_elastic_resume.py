"""Resuming on another number of ranks: a job of 4 ranks saves mid-epoch, 2 ranks resume it, save again mid-epoch,
and 3 ranks finish the epoch. Over the epoch the valid samples are the dataset exactly once (with
last_batch="drop": at most once, and as many as the shards of the phases hold), and the ranks of each phase make
the same number of batches. Orders on their own (every policy, uneven stops as on_error="skip" leaves them), then
Loaders over an image folder, webdataset shards, a TSV table and its converted twin, and the states' errors."""
from __future__ import annotations

import collections
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from feedline.datagen.images import make_images
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader.remainder import ResumedOrder, share_size
from feedline.loader.resume import order_of
from feedline.loader.sampler import EpochSampler, LastBatch
from feedline.loader.sources.text_to_columnar import convert
from feedline.loader.stream_order import StreamOrder
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo

from conftest import write_images

WORLDS = (4, 2, 3)


# ---- orders on their own --------------------------------------------------------------------------------------

def epoch_sampler(n):
    return lambda rank, world, batch, policy: EpochSampler(n, batch, seed=5, rank=rank, world_size=world,
                                                           last_batch=policy)


def stream_order(n):
    rows = np.random.default_rng(n).integers(1, 9, size=n)  # chunks of 1..8 rows, in groups of 3 chunks
    rows = rows[np.cumsum(rows) <= n]
    rows = np.append(rows, n - rows.sum()) if rows.sum() < n else rows
    return lambda rank, world, batch, policy: StreamOrder(rows, np.arange(rows.size) // 3, batch, seed=5, rank=rank,
                                                          world_size=world, last_batch=policy, buffer_rows=7)


def run_phases(make, n, batch, policy, stops_of, epoch=1):
    """Three jobs (``WORLDS``) through epoch ``epoch`` of orders ``make(rank, world, batch, policy)``: the first
    two stop where ``stops_of(shard, rank)`` says; the valid indices delivered, and the plans per rank per phase."""
    delivered, chain, plans_per_phase = [], [], []
    for phase, world in enumerate(WORLDS):
        orders = [order_of(make(rank, world, batch, policy), chain, epoch) for rank in range(world)]
        shard = orders[0].shard_size(epoch)
        assert all(o.shard_size(epoch) == shard for o in orders)
        last = phase == len(WORLDS) - 1
        stops = [shard if last else stops_of(shard, rank) for rank in range(world)]
        counts = []
        for order, stop in zip(orders, stops):
            plans = list(order.epoch(epoch))
            counts.append(len(plans))
            assert sum(p.indices.size for p in plans) == shard
            assert [p.batch for p in plans] == list(range(len(plans)))
            assert shard == 0 or plans[-1].last  # (with DROP the rest can be too short for a batch on each rank)
            assert all(p.indices.size == batch for p in plans[:-1])
            indices, valid = order.positions(epoch, 0, stop)[:2]
            joined = np.concatenate([p.indices for p in plans] + [np.empty(0, np.int64)])[:stop]
            assert np.array_equal(indices, joined)
            delivered += indices[valid].tolist()
        assert len(set(counts)) == 1
        plans_per_phase.append(counts[0])
        chain = chain + [[world, stops]]
    return delivered, plans_per_phase


@pytest.mark.parametrize("policy", list(LastBatch))
@pytest.mark.parametrize("kind", [epoch_sampler, stream_order])
@pytest.mark.parametrize("n, batch", [(203, 4), (61, 3), (29, 2)])
@pytest.mark.parametrize("uneven", [False, True])
def test_orders_deliver_the_rest_exactly_once(kind, n, batch, policy, uneven):
    rng = np.random.default_rng(n * 7 + batch)
    step = {}

    def stops_of(shard, rank):  # lockstep: every rank after the same batches; uneven: anywhere past them
        if rank == 0:
            step["at"] = min(int(rng.integers(0, max(shard // batch, 1))) * batch, shard)
        return int(rng.integers(step["at"], shard + 1)) if uneven else step["at"]

    make = kind(n)
    delivered, _ = run_phases(make, n, batch, policy, stops_of)
    counts = collections.Counter(delivered)
    assert max(counts.values()) == 1 and set(counts) <= set(range(n))
    if policy is not LastBatch.DROP:
        assert sorted(counts) == list(range(n))


def test_a_resize_keeps_each_sample_where_its_epoch_put_it():
    """Without a resize the chain is empty and the order is the job's own; with one, the rest begins with old
    rank 0's next position and the new ranks take contiguous stretches of it."""
    old = [EpochSampler(40, 4, seed=1, rank=r, world_size=4) for r in range(4)]
    assert order_of(old[2], [], 0) is old[2]
    new = [ResumedOrder(EpochSampler(40, 4, seed=1, rank=r, world_size=2), old[0], 0, [4, 4, 4, 4])
           for r in range(2)]
    rest = np.concatenate([o.positions(0, 4, 10)[0] for o in old])
    assert new[0].share == new[1].share == 12 == share_size(24, 2, 4, LastBatch.PARTIAL)
    assert np.array_equal(np.concatenate([n.positions(0, 0, 12)[0] for n in new]), rest)
    assert new[0].resizes(0) == [[4, [4, 4, 4, 4]]] and new[0].resizes(1) == []
    later = EpochSampler(40, 4, seed=1, rank=0, world_size=2).epoch(1)[0].indices
    assert np.array_equal(new[0].epoch(1)[0].indices, later)


@pytest.mark.parametrize("policy", list(LastBatch))
def test_a_ranks_positions_are_every_world_size_th_of_the_permutation(policy):
    """``EpochSampler.positions`` reads a stretch of a rank's share directly: the same as slicing the padded
    permutation (the definition of the share) every world_size-th from the rank."""
    n, world, batch = 23, 3, 2
    permutation = np.random.Generator(np.random.Philox(key=6, counter=[0, 0, 0, 2])).permutation(n)
    for rank in range(world):
        order = EpochSampler(n, batch, seed=6, rank=rank, world_size=world, last_batch=policy)
        padded = np.resize(permutation, order.per_rank * world) if policy is not LastBatch.DROP else permutation
        share = padded[rank::world][:order.per_rank]
        valid = (np.arange(order.per_rank) * world + rank) < n
        indices, ok = order.positions(2, 3, order.per_rank)
        assert np.array_equal(indices, share[3:]) and np.array_equal(ok, valid[3:])
        assert np.array_equal(np.concatenate([p.indices for p in order.epoch(2)]), share)


# ---- Loaders --------------------------------------------------------------------------------------------------

def take(loader, batches):
    """Valid indices of the next ``batches`` batches (all of the epoch's if None), and how many batches came."""
    seen, count = [], 0
    for batch in itertools.islice(loader, batches):
        seen += batch["index"][batch["valid"]].tolist()
        count += 1
    return seen, count


def three_jobs(make, stops=(2, 1, None), gather=(False, True), worlds=WORLDS):
    """Epoch 0 through jobs of ``worlds`` ranks (4, 2 and 3), each rank's Loader from ``make(rank, world)``: each
    job stops after ``stops`` batches (None: the epoch's end) and saves; the next job loads one rank's state, or
    (``gather``) the list of all. Valid indices over the epoch, batches per rank per job, the last states."""
    seen, counts, states = [], [], None
    for phase, world in enumerate(worlds):
        loaders = [make(rank, world) for rank in range(world)]
        for rank, loader in enumerate(loaders):
            if states is not None:
                loader.load_state_dict(states if gather[phase - 1] else states[(rank + 1) % len(states)])
        runs = [iter(loader) for loader in loaders]
        done = []
        for run in runs:
            got, count = take(run, stops[phase])
            seen += got
            done.append(count)
        counts.append(done)
        states = [loader.state_dict() for loader in loaders]
        for loader in loaders:
            loader.close()
    return seen, counts, states


def reference(make):
    """Rank 0 of 3 in epoch 1."""
    loader = make(0, 3)
    loader.set_epoch(1)
    return loader


def assert_once(seen, n):
    counts = collections.Counter(seen)
    assert sorted(counts) == list(range(n)) and max(counts.values()) == 1, counts


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic_images")
    write_images(root, 41, classes=3, seed=4, sizes=[(48, 40)] * 41)
    return root


@pytest.mark.parametrize("policy", ["partial", "pad", "drop"])
def test_an_image_folder_resumes_on_2_then_3_ranks(folder, policy):
    spec = image.train(folder, size=16, output="uint8")

    def make(rank, world):
        return Loader(spec, batch_size=3, placement="cpu", seed=2, rank=rank, world_size=world, last_batch=policy,
                      num_threads=1)

    seen, counts, states = three_jobs(make, (1, 1, None) if policy == "drop" else (2, 1, None))
    assert all(s["complete"] and s["epoch"] == 0 for s in states)
    if policy == "drop":
        # 41 on 4 ranks: 3 batches of 3 each, one delivered; the rest (24) on 2: 4 batches each, one delivered; the
        # rest (18) on 3: two batches each
        assert counts == [[1] * 4, [1] * 2, [2] * 3] and len(seen) == len(set(seen)) == 12 + 6 + 18
        # where the rest cannot fill a batch on every rank, it is dropped: the next epoch starts
        later = make(0, 3)
        later.load_state_dict(three_jobs(make, (2, 1), worlds=(4, 2))[2])  # the rest: 3 on each of 2 ranks
        assert later.epoch == 1 and take(iter(later), None)[0] == take(iter(reference(make)), None)[0]
    else:
        assert counts[:2] == [[2] * 4, [1] * 2] and len(set(counts[2])) == 1
        assert_once(seen, 41)


def test_webdataset_shards_resume_on_2_then_3_ranks(tmp_path):
    make_images(tmp_path / "shards", 26, 2, seed=1, progress=False, workers=1, format="webdataset", shard_size=7)
    spec = image.train(str(tmp_path / "shards" / "train-{000000..000003}.tar"), size=16, output="uint8")
    seen, counts, _ = three_jobs(lambda rank, world: Loader(spec, batch_size=2, placement="cpu", seed=6, rank=rank,
                                                            world_size=world, num_threads=1))
    assert_once(seen, 26)
    assert all(len(set(c)) == 1 for c in counts)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic_tables")
    make_criteo(root / "day_0.tsv", 170, seed=1)
    make_criteo(root / "day_1.tsv", 133, seed=2)
    text = criteo([str(root / "day_0.tsv"), str(root / "day_1.tsv")], table_sizes=100)
    convert(text.source, root / "conv")
    return {"tsv": text, "converted": criteo(root / "conv", table_sizes=100)}


@pytest.mark.parametrize("kind", ["tsv", "converted"])
@pytest.mark.parametrize("policy", ["partial", "pad"])
def test_a_table_resumes_on_2_then_3_ranks(tables, kind, policy):
    seen, counts, states = three_jobs(lambda rank, world: Loader(
        tables[kind], batch_size=8, placement="cpu", seed=3, rank=rank, world_size=world, last_batch=policy,
        shuffle_buffer=20, num_threads=1), stops=(3, 2, None), gather=(False, False))
    assert_once(seen, 303)
    assert all(len(set(c)) == 1 for c in counts)
    assert states[0]["resizes"] == [[4, [24] * 4], [2, [16, 16]]]


def test_skipped_samples_need_every_ranks_state(tmp_path):
    """With on_error="skip" a rank fills its batch past a bad sample and stands further on than the others: one
    rank's state cannot say where the others stopped, the list of all of them can."""
    write_images(tmp_path, 30, classes=2, seed=8, sizes=[(48, 40)] * 30)
    bad = {3, 11, 17}
    for k in bad:
        (tmp_path / f"class_{k % 2}" / f"img_{k:04d}.jpg").write_bytes(b"not an image")
    spec = image.train(tmp_path, size=16, output="uint8")

    def make(rank, world):
        return Loader(spec, batch_size=2, placement="cpu", seed=1, rank=rank, world_size=world, on_error="skip",
                      num_threads=1)

    first = [make(rank, 4) for rank in range(4)]
    for loader in first:
        take(iter(loader), 2)
    states = [loader.state_dict() for loader in first]
    assert len({s["cursor"] for s in states}) > 1  # the ranks stand at different places
    with pytest.raises(ValueError, match="from one rank's state: with on_error='skip'.*states of all 4 ranks"):
        make(0, 2).load_state_dict(states[0])
    seen, counts, _ = three_jobs(make, gather=(True, True))
    paths = sorted(str(p) for p in tmp_path.rglob("*.jpg"))
    bad_index = {paths.index(str(tmp_path / f"class_{k % 2}" / f"img_{k:04d}.jpg")) for k in bad}
    assert sorted(seen) == sorted(set(range(30)) - bad_index)
    assert all(len(set(c)) == 1 for c in counts)


def test_wrong_states_are_named(folder):
    spec = image.train(folder, size=16, output="uint8")

    def make(rank, world, **kw):
        return Loader(spec, batch_size=3, placement="cpu", rank=rank, world_size=world, num_threads=1, **kw)

    def saved(world, batches, **kw):
        loaders = [make(rank, world, **kw) for rank in range(world)]
        for loader in loaders:
            take(iter(loader), batches)
        return [loader.state_dict() for loader in loaders]

    states = saved(4, 1)
    target = make(1, 2)
    cases = [
        (states[:3], r"lack rank\(s\) \[3\]"),
        (states[:3] + [states[1]], r"rank\(s\) \[1\] more than once"),
        (states[:3] + saved(4, 2)[3:], r"not saved at the same step \(position: 1 vs 2\)"),
        (states[:3] + saved(4, 1, seed=9)[3:], r"differently configured Loaders \(seed differ"),
        ([], "empty list"),
        ([states[0], "x"], "item 1 of the list is not a feedline Loader state"),
        ({**states[0], "resizes": [[2, [1]]]}, "invalid 'resizes'"),
        ({**states[0], "cursor": -1}, "invalid position"),
    ]
    for given, words in cases:
        with pytest.raises(ValueError, match=words):
            target.load_state_dict(given)
    with pytest.raises(ValueError, match="batch_size: 3 vs 2"):
        Loader(spec, batch_size=2, placement="cpu", rank=0, world_size=2).load_state_dict(states[0])
    # a failed load leaves the Loader as it was: a whole epoch on 2 ranks
    assert take(iter(target), None)[1] == len(target) == 7


def test_same_world_resume_set_epoch_and_version_2_states(folder):
    """On the same number of ranks a state (or the list of all) resumes exactly where it stood, a version 2 state
    (without resizes) still loads, and set_epoch after a resize runs the whole epoch."""
    spec = image.train(folder, size=16, output="uint8")

    def make(rank, world):
        return Loader(spec, batch_size=3, placement="cpu", seed=2, rank=rank, world_size=world, num_threads=1)

    whole = [take(iter(make(rank, 2)), None)[0] for rank in range(2)]
    loaders = [make(rank, 2) for rank in range(2)]
    for loader in loaders:
        take(iter(loader), 2)
    states = [loader.state_dict() for loader in loaders]
    assert states[0]["version"] == 3 and states[0]["resizes"] == []
    old = {k: v for k, v in states[1].items() if k != "resizes"} | {"version": 2}
    for given in (states, old):
        again = make(1, 2)
        again.load_state_dict(given)
        assert take(iter(again), None)[0] == whole[1][6:]
    resized = make(0, 3)
    resized.load_state_dict(states)
    resized.set_epoch(0)
    assert take(iter(resized), None)[0] == take(iter(make(0, 3)), None)[0]


def test_a_state_at_an_epochs_end_starts_the_next_epoch_on_the_new_ranks(folder):
    spec = image.train(folder, size=16, output="uint8")
    old = Loader(spec, batch_size=3, placement="cpu", seed=2, rank=1, world_size=4, num_threads=1)
    take(iter(old), None)
    new = Loader(spec, batch_size=3, placement="cpu", seed=2, rank=2, world_size=3, num_threads=1)
    new.load_state_dict(old.state_dict())
    reference = Loader(spec, batch_size=3, placement="cpu", seed=2, rank=2, world_size=3, num_threads=1)
    reference.set_epoch(1)
    assert new.epoch == 1
    assert take(iter(new), None)[0] == take(iter(reference), None)[0]


# ---- under torchrun ---------------------------------------------------------------------------------------------

def torchrun(world, data, out, stop):
    worker = Path(__file__).with_name("elastic_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(worker), str(data), str(out), str(stop)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=worker.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"w{world}_rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_torchrun_resizes_from_4_to_2_ranks_with_an_all_reduce_per_batch(tmp_path):
    """4 ranks (gloo on 127.0.0.1) take 3 batches each, skipping a bad file, and gather their states; 2 ranks load
    them and finish the epoch, all-reducing after every batch: no hang, the same batches on both, every good
    sample once."""
    data = tmp_path / "data"
    write_images(data, 27, classes=2, seed=3, sizes=[(48, 40)] * 27)
    bad = data / "class_0" / "img_0002.jpg"
    bad.write_bytes(b"\xff\xd8 not really")
    first = torchrun(4, data, tmp_path, 3)
    saved = torch.load(tmp_path / "states.pt")
    second = torchrun(2, data, tmp_path, -1)
    assert [r["batches"] for r in first] == [3] * 4 and len({r["batches"] for r in second}) == 1
    valid = [i for r in first + second for i, ok in r["seen"] if ok]
    paths = sorted(str(p) for p in data.rglob("*.jpg"))
    assert sorted(valid) == sorted(set(range(27)) - {paths.index(str(bad))})
    # each of the 4 stood where its 6th good sample was: past the bad one on the rank whose share holds it early
    b = paths.index(str(bad))
    shares = [EpochSampler(27, 2, seed=4, rank=r, world_size=4).positions(0, 0, 7)[0].tolist() for r in range(4)]
    assert [s["cursor"] for s in saved] == [7 if b in share[:6] else 6 for share in shares]
    assert any(b in share[:6] for share in shares)  # (so one rank's state could not tell them all)


def test_set_epoch_keeps_the_batches_made_ahead_where_no_resize_is_undone(folder):
    """The batch thread runs on into the next epoch; ``set_epoch`` of that epoch (as a DistributedSampler loop calls
    it) keeps it: only leaving the rest of a resized epoch starts a new one."""
    spec = image.train(folder, size=16, output="uint8")
    loader = Loader(spec, batch_size=3, placement="cpu", seed=2, rank=0, world_size=2, num_threads=1)
    take(iter(loader), None)
    stream = loader.background
    loader.set_epoch(1)
    assert stream is not None and loader.background is stream


def test_a_state_before_an_epochs_first_batch_gives_the_new_ranks_the_whole_epoch(folder):
    """Nothing of the epoch was delivered: the new job runs it as its own (not the old shares with their padding)."""
    spec = image.train(folder, size=16, output="uint8")

    def make(rank, world):
        return Loader(spec, batch_size=3, placement="cpu", seed=2, rank=rank, world_size=world, last_batch="pad",
                      num_threads=1)

    old = make(1, 4)
    old.set_epoch(1)
    new = make(0, 3)
    new.load_state_dict(old.state_dict())
    assert new.epoch == 1 and take(iter(new), None) == take(iter(reference(make)), None)


def test_a_mix_resumes_on_2_then_3_ranks(folder):
    """A mix's places, dealt as one source's: 4 -> 2 -> 3 ranks mid-epoch, every place of the epoch once (a window
    of the whole epoch, so each source gives each of its samples once), equal batch counts in each job."""
    from feedline.pipelines.mix import mix

    spec = mix({"a": image.train(folder, size=16, output="uint8"),
                "b": image.train(folder, size=16, output="uint8", scale=(0.5, 1.0))},
               weights={"a": 0.5, "b": 0.5}, window=82)
    seen, counts, states = three_jobs(lambda rank, world: Loader(spec, batch_size=3, placement="cpu", seed=5,
                                                                 rank=rank, world_size=world, num_threads=1))
    assert_once(seen, 82)
    assert all(len(set(c)) == 1 for c in counts) and counts[:2] == [[2] * 4, [1] * 2]
    assert all(s["complete"] and s["epoch"] == 0 for s in states)
