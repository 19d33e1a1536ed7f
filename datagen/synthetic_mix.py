"""A mix of two generated sources (``feedline make-data mix``): two image folders, or two Criteo files, each
made with a seed of its own, side by side in one folder, to be drawn by ``feedline.pipelines.mix``."""
from __future__ import annotations

from pathlib import Path

from ..pipelines.validate import one_of

SOURCES = ("a", "b")


def make_mix(out: str | Path, *, of: str = "images", count: int = 2000, classes: int = 10, rows: int = 1_000_000,
             seed: int = 0, progress: bool = True) -> dict:
    """``out/a`` and ``out/b``: image folders of ``count`` images each (``of="images"``), or ``out/a.tsv`` and
    ``out/b.tsv`` of ``rows`` Criteo rows each (``of="criteo"``); source ``k`` is made with seed ``seed + k``.
    Returns each source's summary and the ``feedline bench`` command that mixes them."""
    one_of("of", of, ("images", "criteo"))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made, paths = {}, {}
    for k, name in enumerate(SOURCES):
        if of == "images":
            from .images import make_images
            paths[name] = out / name
            made[name] = make_images(paths[name], count=count, classes=classes, seed=seed + k, progress=progress)
        else:
            from .synthetic_criteo import make_criteo
            paths[name] = out / f"{name}.tsv"
            made[name] = make_criteo(paths[name], rows=rows, seed=seed + k)
    pipeline = "image-train" if of == "images" else "criteo"
    mixed = " ".join(f"{name}={paths[name]}:{w}" for name, w in zip(SOURCES, (0.7, 0.3)))
    return {"of": of, "out": str(out), "sources": made,
            "bench": f"feedline bench --pipeline {pipeline} --mix {mixed}"}
