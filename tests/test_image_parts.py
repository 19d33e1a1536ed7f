"""The image runner's parts: which samples share a batch under on_error="skip" (``SkipFill``), the ``StageTimer`` a
profiling caller passes in, and the drawing of every stage's parameters (``StageParams``)."""
import numpy as np
import pytest
import torch

from conftest import write_images
from corrupt_images import payload
from test_fuzz_images import payload as fuzzed
from runners import image_runner
from feedline.loader.errors import OnError
from feedline.loader.runners import image_graph
from feedline.loader.runners.contract import NO_TIMER, SkipFill, StageTimer
from feedline.loader.sampler import EpochSampler
from feedline.pipelines import image
from feedline.pipelines.image_params import StageParams

BAD = (2, 3, 7)
BATCH = 4


@pytest.fixture(scope="module")
def ten_with_bad(tmp_path_factory):
    """Ten images in one class (dataset index = file number); those of ``BAD`` are bad: 2 and 7 are not images
    (found when read), 3 is a JPEG whose header reads well but whose data DALI's decoder rejects (found when DALI
    fails on its batch, which is then formed again without it)."""
    root = tmp_path_factory.mktemp("ten_with_bad")
    paths = write_images(root, 10, classes=1, seed=4, sizes=[(64, 48)] * 10)
    for k in (2, 7):
        paths[k].write_bytes(payload("text", seed=k))
    kind, _, data, _ = fuzzed(11, 11)
    assert kind == "flipped"
    paths[3].write_bytes(data)
    return root


def _made(root, skip_fill, plans):
    runner = image_runner(image.val(root, size=32), batch_size=BATCH, on_error=OnError.SKIP, skip_fill=skip_fill)
    try:
        return [(batch, info) for batch, info in runner.batches(iter(plans))], runner.skipped
    finally:
        runner.close()


def _rows(batch):
    index = batch["index"].tolist()
    valid = batch.get("valid", torch.ones(len(index), dtype=torch.bool)).tolist()
    return index, valid


def test_padding_makes_each_batch_from_its_own_plan(ten_with_bad):
    plans = list(EpochSampler(10, BATCH, shuffle=False).epoch(0))
    made, skipped = _made(ten_with_bad, SkipFill.PADDING, plans)
    assert len(made) == len(plans)
    for (batch, info), plan in zip(made, plans):
        good = [i for i in plan.indices.tolist() if i not in BAD]
        pad = len(plan.indices) - len(good)
        assert _rows(batch) == (good + [-1] * pad, [True] * len(good) + [False] * pad)
        assert (info.end, info.last, info.skipped) == (plan.start + len(plan.indices), plan.last, pad)
        assert not batch["image"][len(good):].any()
    reasons = {s.index: s.reason for s in skipped}
    assert sorted(reasons) == list(BAD)
    assert "not an image" in reasons[2] and "cannot be decoded" in reasons[3]
    # A batch is a function of its plan alone: the middle plan made on its own gives the same batch.
    alone_made, _ = _made(ten_with_bad, SkipFill.PADDING, plans[1:2])
    assert len(alone_made) == 1
    alone = alone_made[0][0]
    assert all(torch.equal(alone[k], made[1][0][k]) for k in made[1][0]) and alone.keys() == made[1][0].keys()


def test_from_later_samples_fills_a_bad_slot_with_the_next_good_sample(ten_with_bad):
    plans = list(EpochSampler(10, BATCH, shuffle=False).epoch(0))
    made, _ = _made(ten_with_bad, SkipFill.FROM_LATER_SAMPLES, plans)
    good = [i for i in range(10) if i not in BAD]
    rows = good + [-1] * (10 - len(good))  # the planned batches keep their sizes; padding only at the end
    sizes = [len(p.indices) for p in plans]
    expected = [rows[sum(sizes[:k]):sum(sizes[:k + 1])] for k in range(len(sizes))]
    assert [_rows(batch)[0] for batch, _ in made] == expected
    assert [_rows(batch)[1] for batch, _ in made] == [[i >= 0 for i in e] for e in expected]
    assert [info.last for _, info in made] == [False, False, True]
    # ... so unlike PADDING, the middle plan on its own is not the batch the stream made from it.
    alone = _made(ten_with_bad, SkipFill.FROM_LATER_SAMPLES, plans[1:2])[0][0][0]
    assert alone["index"].tolist() != made[1][0]["index"].tolist()


def test_a_timer_passed_in_times_the_host_and_torch_stages_and_changes_no_batch(image_dir):
    spec = image.train(image_dir, size=32)
    plans = list(EpochSampler(37, 8, seed=2).epoch(0))
    runner = image_runner(spec, batch_size=8, seed=2)
    try:
        plain = [batch for batch, _ in runner.batches(iter(plans))]
        timer = StageTimer()
        timed = [batch for batch, _ in runner.batches(iter(plans), timer)]
    finally:
        runner.close()
    assert len(plain) == len(timed) == 5
    assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(plain, timed))
    on_this_thread = {spec.stages[0].name} | {n for n, e in runner.engines.items() if e == image_graph.TORCH_CPU}
    assert set(timer.seconds) == on_this_thread and len(on_this_thread) > 1
    assert timer.seconds[spec.stages[0].name] > 0 and all(s >= 0 for s in timer.seconds.values())
    assert NO_TIMER.seconds == {} and not NO_TIMER.timing and NO_TIMER.start() == 0.0


def test_a_samples_parameters_do_not_depend_on_its_batch(image_dir):
    params = StageParams(image.train(image_dir, size=32).stages[1:])
    sizes = np.array([[300, 200], [64, 480], [500, 500]], dtype=np.int64)
    together, _ = params.draw(7, 3, np.array([11, 5, 30]), sizes)
    alone, _ = params.draw(7, 3, np.array([5]), sizes[1:2])
    for stage_all, stage_one in zip(together, alone):
        assert stage_all.keys() == stage_one.keys()
        for name in stage_all:
            assert np.array_equal(stage_all[name][1:2], stage_one[name])
    other_epoch, _ = params.draw(7, 4, np.array([5]), sizes[1:2])
    assert not np.array_equal(other_epoch[0]["window"], alone[0]["window"])


def test_a_decoder_that_crops_takes_the_crop_window_over(image_dir):
    crop = image.random_resized_crop(32)
    plain = StageParams(image.pipeline(image_dir, [image.decode(), crop]).stages[1:])
    cropping = StageParams(image.pipeline(image_dir, [image.decode(roi=True), crop]).stages[1:])
    assert (plain.decoder_crops, cropping.decoder_crops) == (False, True)
    sizes = np.array([[300, 200], [64, 480]], dtype=np.int64)
    (decode_p, crop_p), pixels_p = plain.draw(1, 0, np.array([3, 4]), sizes)
    (decode_c, crop_c), pixels_c = cropping.draw(1, 0, np.array([3, 4]), sizes)
    assert "window" not in decode_p and np.array_equal(decode_c["window"], crop_p["window"])
    assert "window" not in crop_c
    window = crop_p["window"].astype(np.int64)
    assert pixels_p[0] == sizes.prod(axis=1).mean() and pixels_c[0] == (window[:, 2] * window[:, 3]).mean()
    assert pixels_c[1] == pixels_p[1]
