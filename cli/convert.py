"""``feedline convert``: tabular text converted once to a table that reads without parsing."""
from __future__ import annotations

import argparse

from .arguments import existing_path, json_path


def add_parser(sub) -> argparse.ArgumentParser:
    convert = sub.add_parser("convert", help="convert tabular text once to a table that reads without parsing")
    kinds = convert.add_subparsers(dest="kind", required=True)
    criteo = kinds.add_parser("criteo", help="Criteo TSV (plain or gzip) -> a converted folder")
    criteo.add_argument("inputs", nargs="+", type=existing_path, metavar="IN",
                        help="TSV files (or glob patterns), in order")
    criteo.add_argument("--out", required=True, help="output folder (new, or empty)")
    criteo.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                        help="a bad line stops the conversion, or is left out and listed in skipped.tsv")
    criteo.add_argument("--json", type=json_path, metavar="PATH", help="also write the summary as JSON")
    criteo.add_argument("--no-progress", action="store_true")
    return convert


def run(parser: argparse.ArgumentParser, args) -> dict:
    import time

    from tqdm import tqdm

    from ..loader.sources.text_to_columnar import convert
    from ..pipelines.criteo import criteo

    spec = criteo(args.inputs if len(args.inputs) > 1 else args.inputs[0], format="tsv", on_error=args.on_error)
    started = time.perf_counter()
    with tqdm(desc="convert", unit="row", unit_scale=True, disable=args.no_progress) as bar:
        result = convert(spec.source, args.out, progress=bar.update)
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["read_with"] = f"criteo({args.out!r})"
    return result
