"""What both training examples share: argument types that reject bad values with a clear message, and a loop
that measures how long the trainer waits for each batch."""
import argparse
import math
import os
import time

import torch

from feedline.loader import Loader


def checked(cast, accept, expected: str):
    """An argparse ``type=`` that converts with ``cast`` and rejects values ``accept`` refuses."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


positive_int = checked(int, lambda v: v >= 1, "a positive integer")
non_negative_int = checked(int, lambda v: v >= 0, "a non-negative integer")
positive_float = checked(float, lambda v: math.isfinite(v) and v > 0, "a positive number")


def existing_path(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"no such file or directory: {text!r}")
    return text


def device_name(text: str) -> torch.device:
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected 'cpu' or 'cuda', got {text!r}")
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("--device cuda was asked for, but torch sees no usable CUDA GPU")
    return torch.device(text)


def timed_batches(loader: Loader, steps: int | None, clock: dict):
    """Yield ``steps`` batches (one epoch when None), going on into the next epochs as needed.

    The time spent blocked in the loader's ``next()`` is added to ``clock["wait"]``."""
    batches, taken = iter(loader), 0
    while steps is None or taken < steps:
        began = time.perf_counter()
        batch = next(batches, None)
        if batch is None and steps is not None:  # the epoch is over: iter() again runs the next one
            batches = iter(loader)
            batch = next(batches, None)
        waited = time.perf_counter() - began
        clock["wait"] += waited
        clock.setdefault("first", waited)  # the loader's start-up: placement profiling, first batch
        if batch is None:
            return
        taken += 1
        yield batch
