"""A mix's order (``feedline.loader.mix_order``), checked by counting from its plans: every window holds each
source's share within one sample, each source gives each of its samples once per its own epoch, epochs end as
``ends`` says, ranks share an epoch exactly, and ``set_weights`` changes the draw from the place it is given on.
Also the checks a mix's definition makes. No images are read here (the sources are declared, never opened: sized stand-ins take their place)."""
from __future__ import annotations

import numpy as np
import pytest

from feedline.loader.mix_order import MixOrder
from feedline.loader.sources.mixed import MixedSources
from feedline.pipelines import image
from feedline.pipelines.image_sources import ImageFolder
from feedline.pipelines.mix import mix
from feedline.pipelines.tabular import Categorical, Column, ColumnKind, Dense, Schema, TabularFiles, tabular


def make_order(sizes, weights, *, window=100, ends="samples", samples=None, batch_size=16, **kwargs):
    names = [f"s{k}" for k in range(len(sizes))]
    spec = mix({n: image.train(ImageFolder(f"/nowhere/{n}"), size=32) for n in names}, dict(zip(names, weights)),
               window=window, ends=ends, samples=samples)
    by_source = {part.source: size for part, size in zip(spec.parts, sizes)}
    sources = MixedSources(spec, lambda declared: range(by_source[declared]))
    return MixOrder(spec, sources, batch_size, **kwargs)


def whole_epoch(order, epoch):
    plans = list(order.epoch(epoch))
    cat = lambda name: np.concatenate([getattr(p, name) for p in plans])  # noqa: E731
    return {name: cat(name) for name in ("indices", "valid", "sources", "local", "source_epochs")}


CASES = [
    ([500, 300], [0.99, 0.01]),
    ([97, 1000, 41], [0.2, 0.3, 0.5]),
    ([50, 60, 70, 80], [0.01, 0.33, 0.33, 0.33]),
    ([31, 7, 400, 123, 64], [0.05, 0.15, 0.4, 0.3, 0.1]),
]


@pytest.mark.parametrize("sizes,weights", CASES)
def test_every_window_holds_each_share_within_one_sample(sizes, weights):
    order = make_order(sizes, weights, window=100, ends="samples", samples=2000)
    share = np.asarray(weights) / sum(weights)
    for epoch in (0, 1):
        sources = whole_epoch(order, epoch)["sources"]
        assert sources.size == 2000
        for start in range(0, 2000, 100):
            counts = np.bincount(sources[start:start + 100], minlength=len(sizes))
            assert np.all(np.abs(counts - share * 100) < 1), (epoch, start, counts)


@pytest.mark.parametrize("sizes,weights", CASES)
def test_each_source_gives_every_sample_once_per_its_own_epoch(sizes, weights):
    order = make_order(sizes, weights, window=100, ends="samples", samples=1500)
    drawn = [whole_epoch(order, e) for e in range(3)]
    for s, size in enumerate(sizes):
        local = np.concatenate([d["local"][d["sources"] == s] for d in drawn])
        own = np.concatenate([d["source_epochs"][d["sources"] == s] for d in drawn])
        index = np.concatenate([d["indices"][d["sources"] == s] for d in drawn])
        assert np.array_equal(index - sum(sizes[:s]), local)
        assert np.array_equal(own, np.arange(own.size) // size)  # own epochs in turn, none cut short
        for e in range(own.size // size):
            assert sorted(local[e * size:(e + 1) * size].tolist()) == list(range(size))
        tail = local[(own.size // size) * size:]
        assert len(set(tail.tolist())) == tail.size  # the own epoch still running: no repeat yet
        if own.size >= 2 * size:  # a source's own epochs are shuffled anew
            assert not np.array_equal(local[:size], local[size:2 * size])


def test_an_epoch_is_a_pure_function_of_seed_and_epoch():
    a = make_order([90, 40], [0.6, 0.4], window=50, seed=5)
    b = make_order([90, 40], [0.6, 0.4], window=50, seed=5)
    for epoch in (2, 0, 1):  # in any order, without replaying the epochs before
        ea, eb = whole_epoch(a, epoch), whole_epoch(b, epoch)
        assert all(np.array_equal(ea[k], eb[k]) for k in ea)
    other = whole_epoch(make_order([90, 40], [0.6, 0.4], window=50, seed=6), 0)
    assert not np.array_equal(other["indices"], whole_epoch(a, 0)["indices"])


def test_unshuffled_mix_is_round_robin_over_sources_in_their_order():
    d = whole_epoch(make_order([6, 3], [2, 1], window=3, shuffle=False), 0)
    assert d["sources"].tolist() == [0, 1, 0] * 3
    assert d["local"].tolist() == [0, 0, 1, 2, 1, 3, 4, 2, 5]


@pytest.mark.parametrize("ends", ["first", "all"])
def test_an_epoch_ends_when_the_first_or_every_source_has_run_out(ends):
    sizes = [120, 45, 300]
    order = make_order(sizes, [0.3, 0.2, 0.5], window=40, ends=ends)
    taken = np.zeros(3, dtype=np.int64)
    for epoch in range(3):
        d = whole_epoch(order, epoch)
        counts = np.bincount(d["sources"], minlength=3)
        before, taken = taken, taken + counts
        finished = (before // sizes) < (taken // sizes)  # crossed the end of an own epoch in this mixed epoch
        ended = taken % sizes == 0  # ... and stands exactly at one
        last = d["sources"][-1]
        assert ended[last] and finished[last]
        if ends == "first":
            assert finished.sum() == 1 and ended.sum() >= 1
        else:
            assert finished.all()  # every source reached the end of the own epoch it was in
        assert order.shard_size(epoch) == counts.sum()


@pytest.mark.parametrize("last_batch", ["partial", "pad", "drop"])
def test_two_ranks_share_the_epoch_with_equal_batch_counts(last_batch):
    one = whole_epoch(make_order([77, 30], [0.7, 0.3], window=20, batch_size=8, last_batch=last_batch), 1)
    ranks = [make_order([77, 30], [0.7, 0.3], window=20, batch_size=8, last_batch=last_batch, rank=r,
                        world_size=2) for r in (0, 1)]
    plans = [list(r.epoch(1)) for r in ranks]
    assert len(plans[0]) == len(plans[1]) == len(ranks[0])
    got = [whole_epoch(r, 1) for r in ranks]
    valid = np.concatenate([g["indices"][g["valid"]] for g in got])
    own = np.concatenate([g["source_epochs"][g["valid"]] for g in got])
    expected = one["indices"][one["valid"]]
    if last_batch == "drop":
        assert valid.size == 2 * (107 // 2 // 8 * 8) and len(set(zip(valid.tolist(), own.tolist()))) == valid.size
    else:
        assert sorted(zip(valid.tolist(), own.tolist())) == sorted(zip(expected.tolist(),
                                                                        one["source_epochs"].tolist()))
        interleaved = np.empty(valid.size, dtype=np.int64)
        interleaved[0::2], interleaved[1::2] = got[0]["indices"][got[0]["valid"]], got[1]["indices"][got[1]["valid"]]
        assert np.array_equal(interleaved, expected)  # rank r takes every other place, as EpochSampler does


def test_set_weights_changes_the_draw_from_the_given_place_on():
    order = make_order([400, 400], [0.5, 0.5], window=10, samples=300, batch_size=10)
    before = whole_epoch(order, 0)
    order.set_weights({"s0": 0.9, "s1": 0.1}, epoch=0, rank_place=120)
    after = whole_epoch(order, 0)
    assert all(np.array_equal(before[k][:120], after[k][:120]) for k in before)
    for start in range(120, 300, 10):
        assert np.bincount(after["sources"][start:start + 10], minlength=2).tolist() == [9, 1]
    # each source carries on from its own place: nothing repeated, nothing left out of its stream
    for s in (0, 1):
        assert len(set(after["local"][after["sources"] == s].tolist())) == (after["sources"] == s).sum()
    assert order.weights == {"s0": 0.9, "s1": 0.1}
    again = make_order([400, 400], [0.5, 0.5], window=10, samples=300, batch_size=10)
    again.load(order.state())
    assert all(np.array_equal(whole_epoch(again, e)[k], whole_epoch(order, e)[k])
               for e in (0, 1) for k in before)
    assert np.bincount(whole_epoch(again, 1)["sources"][:10]).tolist() == [9, 1]  # in force in later epochs


def test_set_weights_at_the_end_of_an_epoch_starts_with_the_next():
    order = make_order([40, 40], [0.5, 0.5], window=10, samples=50)
    assert order.set_weights({"s0": 4, "s1": 1}, epoch=0, rank_place=50) == (1, 0)
    assert np.bincount(whole_epoch(order, 0)["sources"][40:50]).tolist() == [5, 5]
    assert np.bincount(whole_epoch(order, 1)["sources"][:20]).tolist() == [16, 4]


@pytest.mark.parametrize("weights,message", [
    ({"s0": 1.0}, "missing \\['s1'\\]"),
    ({"s0": 1.0, "s1": 1.0, "x": 1.0}, "unknown \\['x'\\]"),
    ({"s0": 1.0, "s1": -1.0}, "weights\\['s1'\\] must be a positive finite number, got -1.0"),
    ({"s0": 1.0, "s1": float("nan")}, "weights\\['s1'\\] must be a positive finite number"),
    ({"s0": 1.0, "s1": 0.001}, "'s1'.* no sample in a window of 100"),
])
def test_weights_are_checked_when_the_mix_is_defined(weights, message):
    with pytest.raises(ValueError, match=message):
        mix({"s0": image.train(ImageFolder("/a"), size=32), "s1": image.train(ImageFolder("/b"), size=32)}, weights, window=100)


def test_weights_are_normalised():
    spec = mix({"a": image.train(ImageFolder("/a")), "b": image.train(ImageFolder("/b"))}, {"a": 3, "b": 1})
    assert spec.weights == (0.75, 0.25) and spec.names == ("a", "b")


@pytest.mark.parametrize("other,what", [
    (image.train(ImageFolder("/b"), size=48), "size: \\(32, 32\\) vs \\(48, 48\\)"),
    (image.train(ImageFolder("/b"), size=32, output="uint8"), "dtype: 'float32' vs 'uint8'"),
])
def test_a_mix_of_different_outputs_names_both_sources_and_what_differs(other, what):
    with pytest.raises(ValueError, match="sources 'web' and 'curated' give outputs of different types.*" + what):
        mix({"web": image.train(ImageFolder("/a"), size=32), "curated": other}, {"web": 1, "curated": 1})


def _table(path, schema):
    files = TabularFiles(path, "tsv", (Column("y", ColumnKind.INT), Column("x", ColumnKind.FLOAT),
                                       Column("c", ColumnKind.INT)))
    return tabular(schema, files)


def test_tables_of_different_schemas_and_images_with_tables_are_refused():
    a = _table("/t/a.tsv", Schema("y", (Dense("x"), Categorical("c", 100))))
    b = _table("/t/b.tsv", Schema("y", (Dense("x"), Categorical("c", 100, seed=1))))
    mix({"a": a, "b": b}, {"a": 1, "b": 1})  # (a seed is no part of the type)
    c = _table("/t/c.tsv", Schema("y", (Categorical("c", 100),)))
    with pytest.raises(ValueError, match="sources 'a' and 'c' give outputs of different types.*outputs"):
        mix({"a": a, "c": c}, {"a": 1, "c": 1})
    with pytest.raises(ValueError, match="sources 'a' and 'i' cannot be mixed: 'a' gives tables, 'i' gives images"):
        mix({"a": a, "i": image.train(ImageFolder("/i"))}, {"a": 1, "i": 1})


def test_mix_arguments_are_checked():
    two = {"a": image.train(ImageFolder("/a")), "b": image.train(ImageFolder("/b"))}
    with pytest.raises(ValueError, match="window"):
        mix(two, {"a": 1, "b": 1}, window=0)
    with pytest.raises(ValueError, match="ends"):
        mix(two, {"a": 1, "b": 1}, ends="never")
    with pytest.raises(ValueError, match="samples=10 is the epoch's length with ends='samples', but ends='first'"):
        mix(two, {"a": 1, "b": 1}, ends="first", samples=10)
    with pytest.raises(TypeError, match="sources"):
        mix({}, {})
    with pytest.raises(TypeError, match="sources\\['b'\\] must be a feedline pipeline"):
        mix({"a": image.train(ImageFolder("/a")), "b": "folder"}, {"a": 1, "b": 1})


def test_tables_whose_files_differ_in_on_error_are_refused():
    schema = Schema("y", (Dense("x"),))
    columns = (Column("y", ColumnKind.INT), Column("x", ColumnKind.FLOAT))
    a = tabular(schema, TabularFiles("/t/a.tsv", "tsv", columns))
    b = tabular(schema, TabularFiles("/t/b.tsv", "tsv", columns, on_error="skip"))
    with pytest.raises(ValueError, match="differ in on_error"):
        mix({"a": a, "b": b}, {"a": 1, "b": 1})
