"""One rank of the torchrun test: writes the (index, valid) of every sample it was given, per epoch. Every
batch is followed by an all_reduce, as a DDP step would be: a rank yielding fewer batches than another makes
the job hang (and fail on the process group's timeout).

torchrun --standalone --nproc_per_node=2 dist_worker.py DATA OUT LAST_BATCH ON_ERROR
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
    data, out, last_batch, on_error = sys.argv[1:5]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    loader = Loader(image.train(data, size=32, output="uint8"), batch_size=3, seed=4, placement="cpu",
                    last_batch=last_batch, on_error=on_error, num_threads=1)
    epochs, counts = [], []
    for _ in range(2):
        seen, steps = [], 0
        for batch in loader:
            dist.all_reduce(torch.ones(1))  # the gradient all-reduce of a DDP step
            steps += 1
            valid = batch.get("valid")
            seen += [(i, True if valid is None else bool(v)) for i, v in
                     zip(batch["index"].tolist(), (valid.tolist() if valid is not None else [None] * len(batch["index"])))]
        epochs.append(seen)
        counts.append(steps)
    result = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "epochs": epochs,
              "batches": counts, "len": len(loader),
              "skipped": [s.where for s in loader.skipped]}
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
