"""The ``feedline`` parser and its dispatch: each command's flags and work live in a module of its own."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import bench, convert, make_data, plan, profile_command
from .tables import format_table

# in the order ``feedline --help`` lists them
COMMANDS = {"make-data": make_data, "bench": bench, "convert": convert, "plan": plan, "profile": profile_command}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="feedline", description="Input pipelines that keep accelerators fed.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log placement decisions (INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.command in ("bench", "plan") and args.remote_workers is None and (
            args.cpus_per_worker != 1 or args.ray_address is not None):
        parser.error("--cpus-per-worker and --ray-address apply with --remote-workers")
    try:
        result = COMMANDS[args.command].run(parser, args)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError, ConnectionError, ImportError,
            RuntimeError) as exc:
        print(f"feedline {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if args.command not in ("plan", "profile"):  # these print their own report
        print(format_table(result))
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
