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
import time

import torch
import torchvision

from example_args import device_name, existing_path, non_negative_int, positive_float, positive_int, timed_batches
from feedline.loader import Loader
from feedline.pipelines import image


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
