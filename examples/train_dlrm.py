"""Train a small DLRM on Criteo click logs with the feedline loader, and measure how long the training
loop waits for data.

    python examples/train_dlrm.py --data day_0.tsv.gz --table-size 1000000
    python examples/train_dlrm.py --data data/criteo.tsv --device cpu --batch-size 512 --steps 3

The model: a bottom MLP over the 13 dense features, one embedding table per categorical feature (26),
the pairwise dot products of those 27 vectors, and a top MLP to one logit (BCEWithLogits). The tables
are TorchRec's EmbeddingBagCollection fed with ``KeyedJaggedTensor(**batch["sparse"])`` when torchrec
imports, else one ``torch.nn.EmbeddingBag`` per feature (``--embedding-backend``).
At the end it prints one fact per line, then the same facts as one JSON line.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
from torch import nn

from example_args import device_name, existing_path, non_negative_int, positive_float, positive_int, timed_batches
from feedline.loader import Loader
from feedline.pipelines.criteo import CATEGORICAL_NAMES, NUM_DENSE, criteo


def torchrec_error() -> str | None:
    """None if torchrec imports, else why not."""
    try:
        import torchrec  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: fbgemm's native library does not load
        return f"{type(exc).__name__}: {exc}"
    return None


class TorchRecEmbeddings(nn.Module):
    """TorchRec's EmbeddingBagCollection, one table per key; [B, keys, dim] pooled by sum."""

    def __init__(self, keys, table_size: int, dim: int, device: torch.device):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        self.keys, self.dim = list(keys), dim
        self.tables = EmbeddingBagCollection(device=device, tables=[
            EmbeddingBagConfig(name=f"table_{key}", num_embeddings=table_size, embedding_dim=dim, feature_names=[key])
            for key in keys])

    def forward(self, sparse: dict) -> torch.Tensor:
        from torchrec import KeyedJaggedTensor
        pooled = self.tables(KeyedJaggedTensor(**sparse))  # a KeyedTensor, [B, keys * dim] in key order
        return pooled.values().view(-1, len(self.keys), self.dim)


class TorchEmbeddings(nn.Module):
    """One ``nn.EmbeddingBag`` per key, fed from the key-major layout; [B, keys, dim] pooled by sum."""

    def __init__(self, keys, table_size: int, dim: int, device: torch.device):
        super().__init__()
        self.keys = list(keys)
        self.bags = nn.ModuleList(nn.EmbeddingBag(table_size, dim, mode="sum", device=device) for _ in self.keys)
        for bag in self.bags:  # initialised as TorchRec initialises its tables
            nn.init.uniform_(bag.weight, -table_size ** -0.5, table_size ** -0.5)

    def forward(self, sparse: dict) -> torch.Tensor:
        if list(sparse["keys"]) != self.keys:
            raise ValueError(f"batch keys {sparse['keys']} differ from the model's {self.keys}")
        values, offsets = sparse["values"], sparse["offsets"]
        batch = sparse["lengths"].numel() // len(self.keys)
        # Key k owns bags k*B .. (k+1)*B - 1: its per-sample offsets are that slice of offsets, made
        # relative to its first, and its values run from offsets[k*B] to offsets[(k+1)*B].
        starts = offsets[::batch]
        per_key_values = values.split((starts[1:] - starts[:-1]).tolist())  # one host sync per batch
        pooled = [bag(key_values, offsets[k * batch:(k + 1) * batch] - starts[k])
                  for k, (bag, key_values) in enumerate(zip(self.bags, per_key_values))]
        return torch.stack(pooled, dim=1)


def mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, embeddings: nn.Module, num_keys: int, dim: int):
        super().__init__()
        self.bottom = mlp([NUM_DENSE, 128, dim], last_relu=True)
        self.embeddings = embeddings
        vectors = num_keys + 1  # the bottom MLP's output and one embedding per key
        self.register_buffer("pairs", torch.tril_indices(vectors, vectors, offset=-1), persistent=False)
        self.top = mlp([dim + self.pairs.shape[1], 256, 128, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, sparse: dict) -> torch.Tensor:
        x = self.bottom(dense)                                       # [B, dim]
        vectors = torch.cat([x[:, None], self.embeddings(sparse)], 1)  # [B, keys + 1, dim]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))           # [B, keys + 1, keys + 1]
        i, j = self.pairs
        return self.top(torch.cat([x, dots[:, i, j]], 1)).squeeze(1)  # one logit per sample


def train(data: str, *, steps: int | None, batch_size: int, table_size: int, embedding_dim: int,
          embedding_backend: str, lr: float, device: torch.device, seed: int) -> dict:
    torch.manual_seed(seed)
    loader = Loader(criteo(data, table_sizes=table_size), batch_size=batch_size, placement="auto", device=device,
                    seed=seed)
    tables = {"torchrec": TorchRecEmbeddings, "torch": TorchEmbeddings}[embedding_backend]
    keys = list(CATEGORICAL_NAMES)
    model = DLRM(tables(keys, table_size, embedding_dim, device), len(keys), embedding_dim).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = nn.BCEWithLogitsLoss()
    model.train()

    clock = {"wait": 0.0}
    samples = done = 0
    first_loss = last_loss = None
    began = time.perf_counter()
    for batch in timed_batches(loader, steps, clock):
        loss = criterion(model(batch["dense"], batch["sparse"]), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
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
    return {"model": "dlrm", "embedding_backend": embedding_backend, "device": str(device),
            "placement": loader.plan["placement"] if loader.plan else None,
            "steps": done, "samples": samples, "seconds": elapsed, "samples_per_s": samples / elapsed,
            "wait_seconds": clock["wait"], "wait_share": min(clock["wait"] / elapsed, 1.0),
            "first_batch_wait_seconds": clock["first"],
            "loss_start": first_loss, "loss_end": last_loss.item()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=existing_path, required=True,
                        help="Criteo TSV (plain or .gz) or Parquet file")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="stop after this many optimizer steps (default: one epoch)")
    parser.add_argument("--batch-size", type=positive_int, default=2048)
    parser.add_argument("--table-size", type=positive_int, default=100_000,
                        help="rows in each of the 26 embedding tables (ids are hashed modulo this)")
    parser.add_argument("--embedding-dim", type=positive_int, default=16)
    parser.add_argument("--embedding-backend", choices=("auto", "torchrec", "torch"), default="auto",
                        help="auto: torchrec if it imports, else torch.nn.EmbeddingBag")
    parser.add_argument("--lr", type=positive_float, default=0.1, help="SGD learning rate")
    parser.add_argument("--device", type=device_name, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    args = parser.parse_args(argv)

    backend = args.embedding_backend
    if backend != "torch":
        why_not = torchrec_error()
        if why_not is not None and backend == "torchrec":
            parser.error(f"--embedding-backend torchrec: torchrec does not import here ({why_not})")
        backend = "torch" if why_not else "torchrec"

    result = train(args.data, steps=args.steps, batch_size=args.batch_size, table_size=args.table_size,
                   embedding_dim=args.embedding_dim, embedding_backend=backend, lr=args.lr,
                   device=args.device, seed=args.seed)
    print(f"embedding backend: {result['embedding_backend']}")
    print(f"steps: {result['steps']}")
    print(f"samples/s: {result['samples_per_s']:.1f}")
    print(f"waiting for data: {100 * result['wait_share']:.1f}% of {result['seconds']:.2f} s")
    print(f"first batch after: {result['first_batch_wait_seconds']:.2f} s (the loader's start-up)")
    print(f"loss: {result['loss_start']:.4f} at the first step, {result['loss_end']:.4f} at the last")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
