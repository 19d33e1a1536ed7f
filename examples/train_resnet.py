"""Train torchvision's ResNet-18 on an image folder with the feedline loader, and measure how long the
training loop waits for data.

    python examples/train_resnet.py --data /data/imagenet/train --batch-size 256
    python examples/train_resnet.py --data data/images --device cpu --size 64 --batch-size 8 --steps 3

On a GPU the step runs under autocast (float16) with a GradScaler; on the CPU it runs in float32.
At the end it prints one fact per line, then the same facts as one JSON line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torchvision

from feedline.loader import Loader
from feedline.pipelines import image


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


def train(data: str, *, steps: int | None, batch_size: int, size: int, num_threads: int | None,
          lr: float, device: torch.device, seed: int) -> dict:
    torch.manual_seed(seed)
    loader = Loader(image.train(data, size=size), batch_size=batch_size, placement="auto", device=device,
                    seed=seed, num_threads=num_threads)
    model = torchvision.models.resnet18(num_classes=len(loader.source.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    use_amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    model.train()

    clock = {"wait": 0.0}
    samples = done = 0
    first_loss = last_loss = None
    began = time.perf_counter()
    for batch in timed_batches(loader, steps, clock):
        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_amp):
            loss = criterion(model(batch["image"]), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        samples += len(batch["label"])
        done += 1
        last_loss = loss.detach()
        if first_loss is None:
            first_loss = last_loss.item()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - began
    if done == 0:
        raise RuntimeError(f"the loader over {data!r} delivered no batch")
    return {"model": "resnet18", "device": str(device), "placement": loader.plan["placement"] if loader.plan else None,
            "steps": done, "samples": samples, "seconds": elapsed, "samples_per_s": samples / elapsed,
            "wait_seconds": clock["wait"], "wait_share": min(clock["wait"] / elapsed, 1.0),
            "first_batch_wait_seconds": clock["first"],
            "loss_start": first_loss, "loss_end": last_loss.item()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=existing_path, required=True,
                        help="ImageFolder-style directory (root/<class>/<image>) or a '<path> <label>' list file")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="stop after this many optimizer steps (default: one epoch)")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--size", type=positive_int, default=224, help="crop size in pixels")
    parser.add_argument("--workers", "--num-threads", dest="num_threads", type=positive_int, default=None,
                        help="the loader's CPU threads (default: the loader chooses)")
    parser.add_argument("--lr", type=positive_float, default=None,
                        help="SGD learning rate (default: 0.1 * batch size / 256)")
    parser.add_argument("--device", type=device_name, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    args = parser.parse_args(argv)

    lr = args.lr or 0.1 * args.batch_size / 256
    result = train(args.data, steps=args.steps, batch_size=args.batch_size, size=args.size,
                   num_threads=args.num_threads, lr=lr, device=args.device, seed=args.seed)
    print(f"steps: {result['steps']}")
    print(f"samples/s: {result['samples_per_s']:.1f}")
    print(f"waiting for data: {100 * result['wait_share']:.1f}% of {result['seconds']:.2f} s")
    print(f"first batch after: {result['first_batch_wait_seconds']:.2f} s (the loader's start-up)")
    print(f"loss: {result['loss_start']:.4f} at the first step, {result['loss_end']:.4f} at the last")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
