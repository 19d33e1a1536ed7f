"""The configuration a Loader's state is saved with, and whether another Loader can resume from it."""
from __future__ import annotations

from typing import Any, Mapping


def configuration(sampler, pipeline_name: str, on_error: str, shuffle_buffer: int | None) -> dict[str, Any]:
    """What must be equal for a saved position to mean the same samples in another Loader."""
    s = sampler
    return {"num_samples": s.num_samples, "batch_size": s.batch_size, "seed": s.seed, "shuffle": s.shuffle,
            "rank": s.rank, "world_size": s.world_size, "last_batch": s.last_batch.value, "pipeline": pipeline_name,
            "on_error": on_error, "shuffle_buffer": shuffle_buffer}


def check_resumable(saved: Mapping[str, Any], mine: Mapping[str, Any], *, resize: bool = False) -> None:
    """A ValueError saying what differs between the saved configuration and this Loader's, and what a resume
    needs. ``resize``: the state comes from a job of another size (its rank and world_size may differ)."""
    differ = {k: (saved.get(k), v) for k, v in mine.items()
              if saved.get(k) != v and not (resize and k in ("rank", "world_size"))}
    if not differ:
        return
    if "rank" in differ:
        was, now = differ.pop("rank")
        if not differ:
            raise ValueError(f"cannot resume: the state was saved by rank {was} and this Loader is rank {now}; each "
                             f"rank must load the state that its own rank saved (or every rank the list of all "
                             f"ranks' states)")
        differ["rank"] = (was, now)
    raise ValueError("state was saved by a differently configured Loader; (saved, this loader): "
                     + ", ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in differ.items()))
