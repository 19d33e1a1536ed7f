"""A Loader over a mix: each sample in its place is what its own source's pipeline makes of it; ``set_weights``
is followed from the next batch whatever the prefetch; a resume continues as an uninterrupted run; a table mix
puts dense and jagged outputs back in the plan's order; ``make-data`` and ``bench`` run a mix."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from feedline.loader import Loader
from feedline.loader.runners import RunnerConfig, make_runner
from feedline.loader.runners.contract import SkipFill
from feedline.loader.sampler import BatchPlan
from feedline.loader.sources.mixed import part_seed
from feedline.pipelines import image
from feedline.pipelines.mix import mix
from feedline.pipelines.tabular import Categorical, Column, ColumnKind, Dense, MultiHot, Schema, TabularFiles, tabular

from conftest import write_images


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    write_images(root / "a", 11, classes=2, seed=1, sizes=[(64, 48)] * 11)
    write_images(root / "b", 6, classes=2, seed=2, sizes=[(40, 56)] * 6)
    return root


def image_mix(folders, weights=None, **kwargs):
    return mix({"a": image.train(folders / "a", size=32, output="uint8"),
                "b": image.train(folders / "b", size=32, output="uint8", scale=(0.5, 1.0))},
               weights or {"a": 0.6, "b": 0.4}, window=10, **kwargs)


def flat(batch):
    return {k: v.numpy().copy() for k, v in batch.items()}


def same(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def test_each_sample_is_its_sources_own_in_the_plans_place(folders):
    spec = image_mix(folders)
    loader = Loader(spec, batch_size=5, placement="cpu", device="cpu", seed=3)
    batches = [flat(b) for _ in range(2) for b in loader]
    order = loader.sampler
    refs = [make_runner(part, source, RunnerConfig(part.all_cpu, torch.device("cpu"), 5, seed=part_seed(3, k),
                                                   skip_fill=SkipFill.PADDING))
            for k, (part, source) in enumerate(zip(spec.parts, loader.dataset.parts))]
    seen_sources = set()
    position = 0
    epoch = 0
    for batch in batches:
        size = len(batch["index"])
        index, valid, source, local, own = order.positions(epoch, position, position + size)
        assert np.array_equal(batch["index"], index) and np.array_equal(batch["source"], source)
        assert np.array_equal(batch["index"] - loader.dataset.offsets[source], local)
        for s in np.unique(source).tolist():
            for e in np.unique(own[source == s]).tolist():
                places = np.flatnonzero((source == s) & (own == e))
                plan = BatchPlan(local[places], np.ones(places.size, bool), e)
                [(ref, _)] = list(refs[s].batches(iter([plan])))
                assert np.array_equal(batch["image"][places], ref["image"].numpy())
                assert np.array_equal(batch["label"][places], ref["label"].numpy())
                seen_sources.add(s)
        position += size
        if position == order.shard_size(epoch):
            epoch, position = epoch + 1, 0
    assert seen_sources == {0, 1} and epoch == 2
    for r in refs:
        r.close()
    loader.close()


def test_set_weights_is_followed_from_the_next_batch_whatever_the_prefetch(folders):
    def run(prefetch, change):
        loader = Loader(image_mix(folders), batch_size=5, placement="cpu", device="cpu", prefetch=prefetch)
        out = []
        for epoch in range(2):
            for batch in loader:
                out.append(flat(batch))
                if change and len(out) == 3:
                    loader.set_weights({"a": 1, "b": 4})
        loader.close()
        return out

    plain, deep, shallow = run(4, False), run(4, True), run(1, True)
    assert same(deep, shallow)  # the switch falls at the same batch, however many batches were made ahead
    assert same(deep[:3], plain[:3]) and not same(deep[3:], plain[3:])
    sources = np.concatenate([b["source"] for b in deep[:4]])  # epoch 0: 17 places, batches of 5
    assert np.bincount(sources[15:20], minlength=2).tolist()[0] <= 2  # from place 15 on: windows of 2 a, 8 b
    later = np.concatenate([b["source"] for b in deep[4:]])
    assert np.bincount(later[:10], minlength=2).tolist() == [2, 8]  # and in the next epoch


def test_resume_mid_epoch_gives_the_batches_of_an_uninterrupted_run(folders):
    spec = image_mix(folders, ends="all")
    loader = Loader(spec, batch_size=4, placement="cpu", device="cpu", seed=1)
    batches = iter(loader)
    next(batches), next(batches)
    loader.set_weights({"a": 0.3, "b": 0.7})
    next(batches)
    state = loader.state_dict()
    rest = [flat(b) for b in batches] + [flat(b) for b in loader]
    loader.close()
    again = Loader(spec, batch_size=4, placement="cpu", device="cpu", seed=1)
    again.load_state_dict(state)
    assert again.weights == pytest.approx({"a": 0.3, "b": 0.7})
    resumed = [flat(b) for b in again] + [flat(b) for b in again]
    again.close()
    assert len(rest) > 3 and same(resumed, rest)


def _write_table(path, rows, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(rows):
            tags = "|".join(str(t) for t in rng.integers(0, 50, rng.integers(0, 4)))
            f.write(f"{i % 2}\t{rng.uniform(0, 10):.3f}\t{rng.integers(0, 1000)}\t{tags}\n")


def _tables(root):
    files = lambda name: TabularFiles(root / name, "tsv", (  # noqa: E731
        Column("y", ColumnKind.INT), Column("x", ColumnKind.FLOAT), Column("c", ColumnKind.INT),
        Column("tags", ColumnKind.INT_LIST)))
    schema = Schema("y", (Dense("x"), Categorical("c", 97, seed=2), MultiHot("tags", 31, seed=1, max_len=3)))
    return tabular(schema, files("t1.tsv")), tabular(schema, files("t2.tsv"))


def _per_sample(batch, keys):
    """Each sample's label, dense row and, per key, its ids (from the key-major jagged layout)."""
    sparse, n = batch["sparse"], len(batch["index"])
    lengths, offsets, values = (np.asarray(sparse[k]) for k in ("lengths", "offsets", "values"))
    return [(batch["label"][i].tolist(), batch["dense"][i].tolist(),
             [values[offsets[k * n + i]:offsets[k * n + i] + lengths[k * n + i]].tolist() for k in range(len(keys))])
            for i in range(n)]


def test_a_table_mix_puts_dense_and_jagged_outputs_in_the_plans_order(tmp_path):
    _write_table(tmp_path / "t1.tsv", 23, 1)
    _write_table(tmp_path / "t2.tsv", 9, 2)
    one, two = _tables(tmp_path)
    spec = mix({"one": one, "two": two}, {"one": 0.5, "two": 0.5}, window=6)
    loader = Loader(spec, batch_size=7, placement="cpu", device="cpu", shuffle_buffer=8)
    batches = [{k: (v if k == "sparse" else v.numpy()) for k, v in b.items()} for _ in range(2) for b in loader]
    keys = batches[0]["sparse"]["keys"]
    assert keys == ["c", "tags"]
    reference = []
    for part in (one, two):  # each table whole, in file order, as its own pipeline makes it
        ref = Loader(part, batch_size=100, placement="cpu", device="cpu", shuffle=False)
        whole = next(iter(ref))
        reference.append(_per_sample({k: (v if k == "sparse" else v.numpy()) for k, v in whole.items()}, keys))
        ref.close()
    seen = np.zeros(2, dtype=int)
    for batch in batches:
        got = _per_sample(batch, keys)
        for i, (index, source) in enumerate(zip(batch["index"].tolist(), batch["source"].tolist())):
            assert got[i] == reference[source][index - loader.dataset.offsets[source]]
            seen[source] += 1
    assert seen.sum() == 2 * 32 and abs(seen[0] - seen[1]) <= 2  # 32 places an epoch, half each


def test_set_weights_on_a_loader_of_one_source_says_it_is_not_a_mix(folders):
    loader = Loader(image.train(folders / "a", size=32), batch_size=4, placement="cpu", device="cpu")
    with pytest.raises(TypeError, match="not a mix"):
        loader.set_weights({"a": 1})
    loader.close()


def test_two_ranks_make_equal_batch_counts_and_share_the_epoch_exactly(folders):
    spec = image_mix(folders)
    def run(rank, world):
        loader = Loader(spec, batch_size=4, placement="cpu", device="cpu", rank=rank, world_size=world, seed=5)
        out = [(b["index"][b["valid"]].tolist(), b["source"].tolist()) for b in loader]
        loader.close()
        return out
    whole, first, second = run(0, 1), run(0, 2), run(1, 2)
    assert len(first) == len(second) == 3  # 17 places: 9 per rank, one of them padding
    together = sorted(i for b, _ in first + second for i in b)
    assert together == sorted(i for b, _ in whole for i in b)  # every place of the epoch once, over the ranks


def test_a_mix_saved_on_two_ranks_resumes_on_three_with_every_place_once(folders):
    spec = image_mix(folders, weights={"a": 0.5, "b": 0.5})
    def loader(rank, world):
        return Loader(spec, batch_size=2, placement="cpu", device="cpu", rank=rank, world_size=world, seed=4)
    whole = loader(0, 1)
    expected = sorted(i for b in whole for i in b["index"][b["valid"]].tolist())
    whole.close()
    got, states = [], []
    for rank in (0, 1):
        first = loader(rank, 2)
        batches = iter(first)
        for _ in range(2):
            b = next(batches)
            got += b["index"][b["valid"]].tolist()
        states.append(first.state_dict())
        first.close()
    counts = []
    for rank in range(3):
        again = loader(rank, 3)
        again.load_state_dict(states)
        with pytest.raises(ValueError, match="next epoch"):
            again.set_weights({"a": 1, "b": 3})
        batches = [b for b in again]
        counts.append(len(batches))
        got += [i for b in batches for i in b["index"][b["valid"]].tolist()]
        again.close()
    assert len(set(counts)) == 1 and sorted(got) == expected


def test_a_bad_row_of_a_table_source_is_raised_naming_that_source(tmp_path):
    _write_table(tmp_path / "t1.tsv", 23, 1)
    _write_table(tmp_path / "t2.tsv", 9, 2)
    with open(tmp_path / "t2.tsv", "a") as f:
        f.write("1\tnot a number\t3\t\n")
    one, two = _tables(tmp_path)
    loader = Loader(mix({"one": one, "two": two}, {"one": 0.5, "two": 0.5}, window=6), batch_size=7,
                    placement="cpu", device="cpu", shuffle_buffer=8)
    with pytest.raises(Exception) as raised:
        for _ in range(2):
            for _ in loader:
                pass
    loader.close()
    assert "t2.tsv:10" in str(raised.value)
    assert any("making a batch of the mix's source 'two'" in note for note in raised.value.__notes__)


def test_a_padded_last_batch_of_a_table_mix_wraps_past_the_sources_own_epochs(tmp_path):
    # ends="all": the small share's table sets the epoch's length while the large share's runs through several of
    # its own epochs; the padding repeats the epoch's first places, whose stream places lie own epochs back
    _write_table(tmp_path / "t1.tsv", 23, 1)
    _write_table(tmp_path / "t2.tsv", 9, 2)
    one, two = _tables(tmp_path)
    loader = Loader(mix({"one": one, "two": two}, {"one": 1, "two": 4}, window=5, ends="all"), batch_size=10,
                    placement="cpu", device="cpu", shuffle_buffer=8, last_batch="pad", seed=2)
    length = loader.sampler.length(0)  # 113: the last batch's 3 places, then 7 repeated from the epoch's start
    batches = [{k: v.numpy() for k, v in b.items() if k != "sparse"} for b in loader]
    loader.close()
    assert all(len(b["index"]) == 10 for b in batches) and len(batches) == -(-length // 10)
    valid = np.concatenate([b["valid"] for b in batches])
    assert valid.sum() == length and not valid[length:].any()
    index, source = (np.concatenate([b[k] for b in batches]) for k in ("index", "source"))
    first = loader.sampler.positions(0, 0, valid.size - length)
    assert np.array_equal(index[length:], first[0]) and np.array_equal(source[length:], first[2])
    assert set(index[:length][source[:length] == 0].tolist()) == set(range(23))  # its own epoch, whole
