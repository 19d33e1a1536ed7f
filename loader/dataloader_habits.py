"""What a torch DataLoader user brings to a Loader: its keyword arguments, answered with feedline's own, and
the distributed launch that forgot to initialise the process group before building the Loader."""
from __future__ import annotations

import difflib
import inspect
import os
import warnings
from typing import Callable

import torch

# DataLoader's keyword arguments, and what a Loader does instead.
EQUIVALENTS = {
    "num_workers": "feedline makes batches on threads of this process: use num_threads=N (default: the cores "
                   "this process may use); for more CPUs than this machine has, remote=RayWorkers(...)",
    "drop_last": "use last_batch='drop' (drop_last=True) or last_batch='partial' (drop_last=False, the "
                 "default); last_batch='pad' fills the last batch and marks the filling in batch['valid']",
    "pin_memory": "batches arrive on device= already (the copy from pinned staging memory runs on the loader's "
                  "thread): pass device='cuda' instead",
    "pin_memory_device": "pass device='cuda:N' instead",
    "collate_fn": "batches come collated as dicts of tensors; put your own batch function in the pipeline "
                  "(feedline.pipelines.image.custom(fn)) or apply it to each batch in the training loop",
    "sampler": "the order is feedline's: shuffle=, seed= and, for sharding, rank= and world_size= (they default "
               "to torch.distributed's); call loader.set_epoch(epoch) as with DistributedSampler",
    "batch_sampler": "pass batch_size=, shuffle=, seed= and last_batch= instead",
    "persistent_workers": "the loader's threads and pipelines already persist from epoch to epoch: leave it out",
    "prefetch_factor": "use prefetch=N: finished batches kept ready (1 to 16, default 2)",
    "worker_init_fn": "there are no worker processes to initialise; random augmentation is keyed by seed=, "
                      "epoch and sample index",
    "generator": "use seed=: the order is a pure function of (seed, epoch)",
    "multiprocessing_context": "feedline uses threads, not worker processes; for CPUs of other machines, "
                               "remote=RayWorkers(...)",
    "timeout": "not needed: an error or a stalled batch thread is reported to the training loop as it happens",
    "in_order": "batches are always delivered in order",
}


def refuse(unexpected: dict, takes: Callable) -> None:
    """A TypeError for keyword arguments that ``takes`` (the Loader's ``__init__``) does not take, naming
    feedline's equivalent of each DataLoader argument, or the closest accepted name for a misspelt one."""
    if not unexpected:
        return
    accepted = [p.name for p in inspect.signature(takes).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    lines = []
    for name in unexpected:
        if name in EQUIVALENTS:
            lines.append(f"{name}= is a torch DataLoader argument; {EQUIVALENTS[name]}")
        else:
            close = difflib.get_close_matches(name, accepted, n=1)
            hint = f"did you mean {close[0]}=?" if close else f"the Loader's arguments are {', '.join(accepted)}"
            lines.append(f"{name}= is not an argument of Loader; {hint}")
    raise TypeError("Loader() got unexpected keyword argument(s): " + "; ".join(lines))


LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def warn_if_launched_without_process_group() -> None:
    """A launcher (torchrun, torch.distributed.launch, SLURM wrappers) set ``WORLD_SIZE`` > 1, but the process
    group is not initialised yet: the Loader would read the whole dataset on every rank."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return
    if world <= 1 or not torch.distributed.is_available() or torch.distributed.is_initialized():
        return
    warnings.warn(f"feedline: WORLD_SIZE={world} is set (this process was started by a launcher such as torchrun), "
                  f"but torch.distributed is not initialised, so this Loader reads the whole dataset on this rank "
                  f"as if it were alone. Call torch.distributed.init_process_group() before building the Loader, "
                  f"or pass rank= and world_size= yourself.", UserWarning, stacklevel=4)


def default_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank``/``world_size`` as given (both or neither), else ``torch.distributed``'s when it is initialised."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"give both rank and world_size or neither; got rank={rank!r}, world_size={world_size!r}")
    if rank is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    warn_if_launched_without_process_group()
    return 0, 1
