"""The configuration a Loader's state is saved with, and whether another Loader can resume from it."""
from __future__ import annotations

from typing import Any, Mapping


def configuration(sampler, pipeline_name: str, on_error: str, shuffle_buffer: int | None) -> dict[str, Any]:
    """What must be equal for a saved position to mean the same samples in another Loader."""
    s = sampler
    return {"num_samples": s.num_samples, "batch_size": s.batch_size, "seed": s.seed, "shuffle": s.shuffle,
            "rank": s.rank, "world_size": s.world_size, "last_batch": s.last_batch.value, "pipeline": pipeline_name,
            "on_error": on_error, "shuffle_buffer": shuffle_buffer}


def check_resumable(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """A ValueError saying what differs between the saved configuration and this Loader's, and what a resume
    needs."""
    differ = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
    if not differ:
        return
    if "world_size" in differ:
        was, now = differ["world_size"]
        raise ValueError(
            f"cannot resume: the state was saved by a job of {was} process(es) (world_size={was}, this one was rank "
            f"{saved.get('rank')}) and this Loader runs in a job of {now} (world_size={now}). A resume needs the same "
            f"world_size, each rank loading the state its own rank saved: relaunch with {was} processes to resume "
            f"mid-epoch. Resuming on a different number of processes is not supported yet (a later version will "
            f"redistribute the rest of the epoch); to change it now, start an epoch from its beginning with "
            f"loader.set_epoch(epoch) (after a state saved at an epoch's end, state['complete'] is True and "
            f"set_epoch(state['epoch'] + 1) continues exactly).")
    if "rank" in differ:
        was, now = differ.pop("rank")
        if not differ:
            raise ValueError(f"cannot resume: the state was saved by rank {was} and this Loader is rank {now}; each "
                             f"rank must load the state that its own rank saved")
        differ["rank"] = (was, now)
    raise ValueError("state was saved by a differently configured Loader; (saved, this loader): "
                     + ", ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in differ.items()))
