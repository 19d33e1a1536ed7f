"""Argument types shared by the commands: each names what it expected and what came."""
from __future__ import annotations

import argparse
import math
from pathlib import Path


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def trainer_step(text: str) -> float | str:
    """``--trainer-step-ms``: a positive, finite number of milliseconds, or ``auto``."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds > 0 or 'auto', got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds > 0 or 'auto', got {text!r}")
    return value


def existing_path(text: str) -> str:
    """An existing path, or webdataset shards named by a pattern (braces or glob characters) that match."""
    if Path(text).exists():
        return text
    from ..pipelines.shard_patterns import has_braces, has_glob, shard_paths
    if has_braces(text) or has_glob(text):
        try:
            shard_paths(text)
        except (FileNotFoundError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    raise argparse.ArgumentTypeError(f"{text!r} does not exist")


def existing_folder(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not an existing folder")
    return text


def json_path(text: str) -> str:
    parent = Path(text).resolve().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: folder {str(parent)!r} does not exist")
    return text


def add_remote_workers(command: argparse.ArgumentParser) -> None:
    """``--remote-workers`` and the flags that go with it (bench and plan)."""
    command.add_argument("--remote-workers", type=positive_int, default=None, metavar="N",
                         help="add N Ray workers (pip install 'feedline[ray]'); the cluster is RAY_ADDRESS's "
                              "or --ray-address, else a local one")
    command.add_argument("--cpus-per-worker", type=positive_int, default=1)
    command.add_argument("--ray-address", default=None, metavar="HOST:PORT")
