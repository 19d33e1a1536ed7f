"""The batch thread's ``valid`` mask (loader.delivery): every all-valid batch gets a mask of its own, all True, of
its rows and on its index's device, whatever was done to an earlier batch's; a batch with one keeps it."""
import weakref

import torch

from feedline.loader.delivery import Delivered, complete


def _batch(rows):
    return {"index": torch.arange(rows), "label": torch.zeros(rows)}


def test_an_all_valid_batch_gets_its_own_mask_whatever_a_trainer_wrote_into_another():
    first, second = _batch(8), _batch(8)
    assert complete(first) == 8
    assert first["valid"].dtype == torch.bool and first["valid"].shape == (8,) and bool(first["valid"].all())
    first["valid"][3] = False  # a trainer masks a sample in place
    first["valid"].logical_not_()
    assert complete(second) == 8
    assert bool(second["valid"].all()) and second["valid"].data_ptr() != first["valid"].data_ptr()
    assert first["valid"].tolist() == [False] * 3 + [True] + [False] * 4  # (first's own, as written above)
    second["valid"].zero_()
    third = _batch(8)
    complete(third)
    assert bool(third["valid"].all())
    assert len({b["valid"].data_ptr() for b in (first, second, third)}) == 3


def test_masks_follow_the_rows_of_each_batch():
    for rows in (8, 8, 3, 8, 0, 5):
        batch = _batch(rows)
        assert complete(batch) == rows
        valid = batch["valid"]
        assert valid.shape == (rows,) and valid.dtype == torch.bool and bool(valid.all())
        assert valid.is_contiguous() and valid.device == batch["index"].device and not valid.requires_grad


def test_a_batch_with_a_mask_keeps_it_and_counts_its_valid_samples():
    batch = _batch(4)
    mask = torch.tensor([True, False, True, False])
    batch["valid"] = mask
    assert complete(batch) == 2 and batch["valid"] is mask
    assert complete(None) == 0


def test_delivered_counts_the_rows_of_a_batch_with_a_mask_apart_from_its_valid_samples():
    masked = _batch(3)
    masked["valid"] = torch.tensor([True, False, False])
    assert [(n, rows) for _, _, n, rows in Delivered(iter([(masked, "a"), (_batch(5), "b")]))] == [(1, 3), (5, 5)]


def test_delivered_completes_each_batch_of_a_stream():
    stream = Delivered(iter([(_batch(2), "a"), (None, "b"), (_batch(3), "c")]))
    got = list(stream)
    assert [(info, n, rows) for _, info, n, rows in got] == [("a", 2, 2), ("b", 0, 0), ("c", 3, 3)]
    assert got[1][0] is None and got[0][0]["valid"].tolist() == [True, True]


def test_a_delivered_batch_is_completed_with_no_python_call_of_its_own():
    """The batch thread resumes one generator per batch: completing a batch calls no Python function besides."""
    import sys

    made = [(_batch(4), "a"), (_batch(4), "b"), (None, "c")]
    source = iter(made)  # (a list's iterator: no Python frame of its own)
    stream = Delivered(source)
    calls = []

    def count(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    got = []
    sys.setprofile(count)
    try:
        for _ in made:
            got.append(next(stream._completed))
    finally:
        sys.setprofile(None)
    assert [(n, rows) for _, _, n, rows in got] == [(4, 4), (4, 4), (0, 0)]
    assert all(b["valid"].all() for b, *_ in got[:2])
    assert calls == ["_each_completed"] * 3


def test_a_mask_the_trainer_let_go_of_is_filled_again_and_one_still_held_never_is():
    stream = Delivered((_batch(rows), i) for i, rows in enumerate((4, 4, 4, 4, 3)))
    first = next(stream)[0]
    first["valid"][1] = False  # the trainer writes into its mask, then lets the batch go
    let_go = weakref.ref(first["valid"])
    del first
    second = next(stream)[0]
    assert second["valid"] is let_go() and second["valid"].tolist() == [True] * 4  # kept, filled again
    view = second["valid"][:2]  # a view keeps the mask's storage: it is not filled again under it
    del second
    third = next(stream)[0]
    assert third["valid"] is not let_go() and view.data_ptr() != third["valid"].data_ptr()
    third["valid"].zero_()
    fourth = next(stream)[0]  # third is held: its mask is not fourth's
    assert fourth["valid"].data_ptr() not in (third["valid"].data_ptr(), view.data_ptr())
    assert view.tolist() == [True, True] and third["valid"].tolist() == [False] * 4
    del third, fourth, view
    last = next(stream)[0]
    assert last["valid"].shape == (3,) and last["valid"].tolist() == [True] * 3  # never a mask of other rows
