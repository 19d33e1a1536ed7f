"""The profile times a Loader's capacity in its steady state, as the placement model predicts it: untimed batches
first (as many as are timed, at least the Loader's read-ahead and a streamed table's first two shuffle buffer-fulls,
no more than an epoch of them), then the timed ones; ``warmup`` given says how many."""
import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader, profile_run
from feedline.loader.profile import profile_loader
from feedline.loader.profile_run import warmup_batches
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo


def test_warmup_is_as_long_as_the_timed_stretch_and_covers_the_read_ahead_and_two_buffer_fulls():
    assert warmup_batches(40, 2) == 40                     # images, the brief's --batches 40
    assert warmup_batches(2, 2) == 5                       # at least the read-ahead: 2 x prefetch + 1
    assert warmup_batches(3, 4) == 9
    assert warmup_batches(10, 2, buffer_batches=8) == 16   # a table: its first two buffer-fulls
    assert warmup_batches(40, 2, buffer_batches=8, epoch_batches=122) == 40
    assert warmup_batches(3, 2, buffer_batches=256, epoch_batches=12) == 12  # no more than an epoch of them
    with pytest.raises(ValueError, match="batches must be a positive integer, got 0"):
        warmup_batches(0, 2)


def _untimed_then_timed(monkeypatch):
    """Counts the batches the profile takes before its first timed stretch, and those it times there."""
    seen = {"before": 0, "timed": None}
    real_timed = profile_run.timed

    def timed(stream, batches, step, sync):
        if seen["timed"] is None:
            seen["timed"] = batches
        return real_timed(stream, batches, step, sync)

    real_endless = profile_run.endless

    def endless(make):
        for batch in real_endless(make):
            if seen["timed"] is None:
                seen["before"] += 1
            yield batch

    monkeypatch.setattr(profile_run, "timed", timed)
    monkeypatch.setattr(profile_run, "endless", endless)
    return seen


def test_the_capacity_is_timed_after_the_warmup(image_dir, monkeypatch):
    seen = _untimed_then_timed(monkeypatch)
    with Loader(image.val(image_dir, size=32), 4, placement="cpu", cache="off") as loader:
        profile_loader(loader, batches=6)
        assert seen == {"before": warmup_batches(6, loader.prefetch), "timed": 6}


def test_a_table_is_timed_after_its_first_buffer_fulls_and_warmup_may_be_given(tmp_path, monkeypatch):
    path = tmp_path / "day.tsv"
    make_criteo(path, rows=3000, seed=0)
    seen = _untimed_then_timed(monkeypatch)
    with Loader(criteo(str(path)), 128, placement="cpu", num_threads=1, shuffle_buffer=512) as loader:
        profile_loader(loader, batches=2)
        assert seen == {"before": 8, "timed": 2}  # two buffer-fulls of 4 batches
        seen.update(before=0, timed=None)
        profile_loader(loader, batches=2, warmup=1)
        assert seen == {"before": 1, "timed": 2}
        with pytest.raises(ValueError, match="warmup must be a positive integer, got 0"):
            profile_loader(loader, batches=2, warmup=0)
