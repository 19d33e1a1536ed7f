"""Remote workers' batches carry ``valid`` like local ones: a scenario of tests/ray_scenarios.py (its one Ray
session, inside a network namespace where only loopback is up), checked by tests/test_valid_remote.py."""
from pathlib import Path

import torch

from feedline.loader import Loader, RayWorkers
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo


def epoch(loader) -> dict:
    """Per batch: whether ``valid`` is there as a bool tensor beside ``index``; and the valid indices."""
    checks, delivered = [], []
    for batch in loader:
        valid = batch.get("valid")
        checks.append(isinstance(valid, torch.Tensor) and valid.dtype == torch.bool
                      and valid.shape == batch["index"].shape and valid.device == batch["index"].device)
        if checks[-1]:
            delivered += batch["index"][valid].tolist()
    return {"checks": checks, "delivered": delivered}


def run(data: Path, workers: RayWorkers) -> dict:
    """An epoch of ``data/images`` (one of them not an image) and of ``data/criteo.tsv`` on ``workers``."""
    report = {}
    for name, spec, kwargs in (
            ("images", image.val(data / "images", size=32), {"batch_size": 4, "on_error": "skip"}),
            # Buffer-fulls of two batches: a table's are dealt whole, the first to the local side.
            ("criteo", criteo(data / "criteo.tsv", table_sizes=1000), {"batch_size": 64, "last_batch": "partial",
                                                                         "shuffle_buffer": 128})):
        loader = Loader(spec, placement="cpu", remote=workers, **kwargs)
        report[name] = epoch(loader)
        report[name]["remote_batches"] = loader.runner.remote_batches
        loader.close()
    return report
