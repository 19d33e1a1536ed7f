"""``feedline make-data``: a synthetic dataset (images, Criteo rows, or a mix of two), never over what --out holds
unless told."""
from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import non_negative_int, positive_int


def add_parser(sub) -> argparse.ArgumentParser:
    make = sub.add_parser("make-data", help="write a synthetic dataset")
    kinds = make.add_subparsers(dest="kind", required=True)
    images = kinds.add_parser("images", help="photo-like JPEGs (plus a few grayscale and PNG) in ImageFolder layout "
                                             "or webdataset shards")
    images.add_argument("--out", required=True, help="output directory (new, or empty; --force replaces a dataset "
                                                     "that make-data wrote there)")
    images.add_argument("--count", type=positive_int, default=2000)
    images.add_argument("--classes", type=positive_int, default=10)
    images.add_argument("--seed", type=non_negative_int, default=0)
    images.add_argument("--format", choices=("folder", "webdataset"), default="folder",
                        help="an ImageFolder tree, or webdataset tar shards DIR/train-000000.tar, ... (default folder)")
    images.add_argument("--shard-size", type=positive_int, default=None,
                        help="samples per shard with --format webdataset (default 1000)")
    criteo = kinds.add_parser("criteo", help="rows with Criteo-like statistics")
    criteo.add_argument("--out", required=True, help="output file (.tsv, .tsv.gz or .parquet)")
    criteo.add_argument("--rows", type=positive_int, default=1_000_000)
    criteo.add_argument("--seed", type=non_negative_int, default=0)
    criteo.add_argument("--format", choices=("tsv", "parquet"), default="tsv")
    mixed = kinds.add_parser("mix", help="two generated sources side by side (OUT/a and OUT/b), to mix with "
                                          "`feedline bench --mix`")
    mixed.add_argument("--out", required=True, help="output directory (new, or empty)")
    mixed.add_argument("--of", choices=("images", "criteo"), default="images",
                       help="two image folders, or two Criteo TSV files (default images)")
    mixed.add_argument("--count", type=positive_int, default=2000, help="images per source")
    mixed.add_argument("--classes", type=positive_int, default=10)
    mixed.add_argument("--rows", type=positive_int, default=1_000_000, help="Criteo rows per source")
    mixed.add_argument("--seed", type=non_negative_int, default=0, help="source k is made with seed + k")
    for kind in (images, criteo, mixed):
        kind.add_argument("--force", action="store_true", help="replace what --out holds")
    return make


def run(parser: argparse.ArgumentParser, args) -> dict:
    out = Path(args.out)
    if args.kind == "mix":
        if out.is_dir() and any(out.iterdir()) and not args.force:
            raise ValueError(f"--out {args.out!r} is not empty; pass --force to replace a mix that feedline "
                             f"make-data wrote there")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {args.out!r} is a file; make-data mix writes a folder")
        if args.force and args.of == "criteo":
            for name in ("a.tsv", "b.tsv"):
                if (out / name).is_dir():
                    raise ValueError(f"--out {args.out!r}: {name} is a folder; make-data mix writes a file there")
        from ..datagen.synthetic_mix import make_mix
        return make_mix(out, of=args.of, count=args.count, classes=args.classes, rows=args.rows, seed=args.seed)
    if args.kind == "images":
        if args.shard_size is not None and args.format != "webdataset":
            parser.error("--shard-size applies to --format webdataset")
        if out.is_dir() and any(out.iterdir()) and not args.force:
            raise ValueError(f"--out {args.out!r} is not empty; pass --force to replace a dataset that feedline "
                             f"make-data wrote there (nothing else is ever removed)")
        from ..datagen.images import DEFAULT_SHARD_SIZE, make_images
        return make_images(args.out, count=args.count, classes=args.classes, seed=args.seed, format=args.format,
                           shard_size=args.shard_size or DEFAULT_SHARD_SIZE)
    if out.is_dir():
        raise ValueError(f"--out {args.out!r} is a folder; make-data criteo writes a file (e.g. {args.out}/day_0.tsv)")
    if out.exists() and not args.force:
        raise ValueError(f"--out {args.out!r} exists; pass --force to replace it")
    from ..datagen.synthetic_criteo import make_criteo
    return make_criteo(args.out, rows=args.rows, seed=args.seed, format=args.format)
