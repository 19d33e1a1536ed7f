"""``feedline profile``: where a pipeline's time goes (per-stage costs, the bottleneck, the headroom, one
recommendation), printed as a table and written as DIR/profile.json and DIR/profile.png."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .arguments import existing_path, positive_int, trainer_step
from .specs import PIPELINES, batch_size_of, device_for, pipeline_spec


def out_folder(text: str) -> str:
    """A folder to write into: an existing one, or a new one in an existing folder."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    if not path.exists() and not path.resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot make {text!r}: folder {str(path.resolve().parent)!r} does not exist")
    return text


def add_parser(sub) -> argparse.ArgumentParser:
    profile = sub.add_parser("profile", help="where a pipeline's time goes: per-stage costs, the bottleneck, the "
                                             "headroom and what would help")
    profile.add_argument("--pipeline", choices=PIPELINES, required=True)
    profile.add_argument("--data", type=existing_path, required=True,
                         help="dataset directory or file, or a shard pattern")
    profile.add_argument("--placement", default="auto", choices=("auto", "cpu", "gpu"))
    profile.add_argument("--batch-size", type=positive_int, default=None)
    profile.add_argument("--batches", type=positive_int, default=40, help="batches timed per measurement")
    profile.add_argument("--output", choices=("float", "uint8"), default="float", help="image output format")
    profile.add_argument("--cache", choices=("auto", "on", "off"), default="auto",
                         help="the Loader's cache of the deterministic prefix (decoded images, a text table's parsed "
                              "chunks); 'off' profiles every sample recomputed, the same state throughout")
    profile.add_argument("--trainer-step-ms", type=trainer_step, default=None, metavar="MS|auto",
                         help="also measure under a simulated trainer that sleeps MS per batch (auto: the loader's "
                              "own batch time): the delivered rate, the trainer's waits and the headroom")
    profile.add_argument("--out", type=out_folder, required=True, metavar="DIR",
                         help="where profile.json and profile.png are written")
    return profile


def run(parser: argparse.ArgumentParser, args) -> dict:
    """Profiles, prints the table and writes the files; returns the profile (as JSON data)."""
    from ..loader.loader import Loader
    from ..loader.profile import profile_loader
    from ..loader.profile_plot import PLOT_EXTRA

    spec = pipeline_spec(args.pipeline, args.data, args.output)
    batch_size = batch_size_of(args.pipeline, args.batch_size)
    device = device_for(args.placement)
    out = Path(args.out)
    with Loader(spec, batch_size, placement=args.placement, device=device, last_batch="drop",
                cache=args.cache) as loader:
        out.mkdir(exist_ok=True)  # once the arguments made a Loader: a refused run leaves no folder behind
        profile = profile_loader(loader, batches=args.batches, trainer_step_ms=args.trainer_step_ms)
    (out / "profile.json").write_text(profile.to_json())
    print(profile.table())
    print(f"\nwrote {out / 'profile.json'}")
    try:
        profile.plot(out / "profile.png")
        print(f"wrote {out / 'profile.png'}")
    except ImportError:
        print(f"no picture: matplotlib is not installed ({PLOT_EXTRA})", file=sys.stderr)
    return profile.to_dict()
