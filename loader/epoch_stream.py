"""The Loader's batches in flight: one ``BackgroundStream`` making batches from a place in an epoch on, running
into the epochs after it (so the next epoch's first batches are in flight while this epoch's last ones are
consumed), and the place of the next batch it makes, which says when it must be opened again elsewhere."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator

import torch

from .background import BackgroundStream
from .cursor import Cursor
from .delivery import Delivered
from .guards import StaleIteratorError
from .sampler import Order


class EpochStream:
    """``thread``: the ``BackgroundStream`` while one runs, else None; ``at``: ``(epoch, sample)`` of the next
    batch it makes; ``next()``: the next ``(batch, info, valid samples, rows)`` (``Delivered``), the thread's own
    ``__next__`` (no call of this class's per batch). The thread holds the order and the runner's ``batches``,
    never the Loader."""

    def __init__(self):
        self.thread: BackgroundStream | None = None
        self.at: tuple[int, int] | None = None
        self.next: Callable[[], tuple[dict | None, Any, int, int]] = _no_thread

    def open(self, order: Order, batches: Callable[[Iterator], Iterator], cursor: Cursor, *, prefetch: int,
             device: torch.device, making: str, placement: str) -> None:
        """Batches of ``order`` from the ``cursor``'s next sample on, ``prefetch`` ahead, made by ``batches(plans)``
        and delivered on ``device``; ``making`` and ``placement`` say what, for an error's note."""
        self.close()
        epoch, start = cursor.next_sample
        done = 0 if cursor.complete else cursor.batches  # batches of ``epoch`` already delivered
        plans = (plan for e in itertools.count(epoch)
                 for plan in order.epoch(e, start_sample=start if e == epoch else 0,
                                         first_batch=done if e == epoch else 0))
        where = f"making {making} from sample {start} of epoch {epoch} on (placement {placement})"
        self.thread = BackgroundStream(lambda: Delivered(batches(plans)), prefetch,
                                       cuda=device if device.type == "cuda" else None, describe=lambda: where)
        self.at = (epoch, start)
        self.next = self.thread.__next__

    def stands_at(self, place: tuple[int, int]) -> bool:
        """Whether a thread runs whose next batch starts at ``place``."""
        return self.thread is not None and self.at == place

    def close(self, wait: bool = True) -> None:
        """Stop the thread (``BackgroundStream.close``: a finaliser must not ``wait``)."""
        if self.thread is not None:
            self.thread.close(wait=wait)
        self.thread, self.at, self.next = None, None, _no_thread

    def let_go(self) -> None:
        """Forget the thread without touching it: in a child made by ``fork()`` it is the parent's."""
        self.thread, self.next = None, _no_thread


def _no_thread() -> tuple[dict | None, Any, int, int]:
    """``EpochStream.next`` while no thread runs: the stream was closed under an iterator still in use."""
    raise StaleIteratorError(
        "this iterator of the Loader was stopped: Loader.close(), load_state_dict() or set_epoch() ran since it "
        "began, which end the batches it was taking. Start a new iteration (iter(loader)) to go on from the "
        "Loader's position now.")
