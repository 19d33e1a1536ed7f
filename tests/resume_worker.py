"""Run a Loader and save, after every batch, the batch and the loader's state; used by test_resume_process.

python resume_worker.py DATA OUT [--resume STATE] [--stop-after K]
With --stop-after K the process, after saving batch K, waits to be killed.
"""
import argparse
import time
from pathlib import Path

import torch

from feedline.loader import Loader
from feedline.pipelines import image


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--resume")
    parser.add_argument("--stop-after", type=int)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loader = Loader(image.train(args.data, size=32, output="uint8"), batch_size=4, seed=9, placement="cpu",
                    on_error="skip")
    first = 0
    if args.resume:
        state = torch.load(args.resume)
        loader.load_state_dict(state["loader"])
        first = state["batches"]
    k = first
    while True:  # two epochs in all, however many were done before a resume
        for batch in loader:
            k += 1
            torch.save({"index": batch["index"], "image": batch["image"]}, out / f"batch_{k:04d}.pt")
            torch.save({"loader": loader.state_dict(), "batches": k}, out / "state.tmp")
            (out / "state.tmp").replace(out / "state.pt")
            if args.stop_after == k:
                (out / "ready").write_text(str(k))
                time.sleep(600)
        if loader.epoch >= 1:
            break


if __name__ == "__main__":
    main()
