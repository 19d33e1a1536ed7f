"""One rank of the elastic torchrun test. Every batch is followed by an all_reduce, as a DDP step would be: a rank
yielding fewer batches than another makes the job hang (and fail on the process group's timeout).

torchrun --standalone --nproc_per_node=W elastic_worker.py DATA OUT STOP
The job resumes from OUT/states.pt when it exists (the list of every rank's state, whatever number of ranks saved
it), takes STOP batches of epoch 0 (-1: the rest of it), gathers every rank's state and rank 0 saves them there;
each rank writes the (index, valid) of every sample it was given and its number of batches.
"""
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from feedline.loader import Loader
from feedline.pipelines import image


def main():
    data, out, stop = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = Loader(image.train(data, size=16, output="uint8"), batch_size=2, seed=4, placement="cpu",
                    on_error="skip", num_threads=1)
    if (out / "states.pt").exists():
        loader.load_state_dict(torch.load(out / "states.pt"))
    seen, steps = [], 0
    for batch in loader:
        dist.all_reduce(torch.ones(1))  # the gradient all-reduce of a DDP step
        steps += 1
        seen += list(zip(batch["index"].tolist(), batch["valid"].tolist()))
        if steps == stop:
            break
    states = [None] * world
    dist.all_gather_object(states, loader.state_dict())
    dist.barrier()  # every rank has read states.pt before rank 0 replaces it
    if rank == 0:
        torch.save(states, out / "states.tmp")
        (out / "states.tmp").replace(out / "states.pt")
    Path(out, f"w{world}_rank{rank}.json").write_text(json.dumps({"seen": seen, "batches": steps}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
