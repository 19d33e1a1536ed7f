"""Tar shards written byte by byte, with any header field set to anything (negative sizes, bad checksums,
malformed pax records), and a child process that reads them through the Loader under a time and memory
watchdog: a reader that loops or balloons fails the test instead of stalling or killing the machine.

``python tests/hostile_tars.py run SPEC.json OUT.json`` is the child's entry point.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
from PIL import Image

BLOCK = 512
MEMORY_LIMIT = 1 << 31  # bytes of resident memory the child may reach (a looping reader passes it in seconds)


def jpeg(seed: int, width: int = 40, height: int = 32) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    a, b = rng.uniform(-0.3, 0.3, 2)
    img = np.clip(128 + 90 * np.sin(a * xx[..., None] + b * yy[..., None] + rng.uniform(0, 6, 3)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def octal(value: int, width: int = 12) -> bytes:
    return b"%0*o\x00" % (width - 1, value)


def base256(value: int, width: int = 12) -> bytes:
    """GNU's base-256 number field (negative: two's complement, first byte 0xff)."""
    if value >= 0:
        return b"\x80" + value.to_bytes(width - 1, "big")
    return b"\xff" + ((1 << (8 * (width - 1))) + value).to_bytes(width - 1, "big")


def header(name: bytes, size: int | bytes, kind: bytes = b"0", *, checksum: bytes | None = None) -> bytes:
    """A ustar header block; ``size`` an int (octal) or the raw 12 bytes of the field; ``checksum`` the raw
    8 bytes of that field (default: the right one)."""
    block = bytearray(BLOCK)
    block[0:len(name)] = name[:100]
    block[100:108] = b"0000644\x00"
    block[108:116] = b"0000000\x00"
    block[116:124] = b"0000000\x00"
    block[124:136] = octal(size) if isinstance(size, int) else size
    block[136:148] = octal(1700000000)
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b" " * 8
    block[148:156] = checksum if checksum is not None else b"%06o\x00 " % sum(block)
    return bytes(block)


def fix_checksum(block: bytes) -> bytes:
    block = bytearray(block)
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def member(name: str, data: bytes, **kw) -> bytes:
    return header(name.encode(), len(data), **kw) + padded(data)


def pax(records: dict[str, str] | bytes) -> bytes:
    """A pax extended header ('x') with these records (or raw record bytes)."""
    if isinstance(records, dict):
        body = b""
        for key, value in records.items():
            text = f" {key}={value}\n".encode()
            length = len(text) + 1
            while len(str(length)) + len(text) != length:  # the length counts its own digits
                length = len(str(length)) + len(text)
            body += str(length).encode() + text
    else:
        body = records
    return header(b"./PaxHeaders/x", len(body), b"x") + padded(body)


def end() -> bytes:
    return bytes(2 * BLOCK)


def sample(key: str, seed: int, label: int) -> list[tuple[str, bytes]]:
    return [(f"{key}.jpg", jpeg(seed)), (f"{key}.cls", str(label).encode())]


def shard_bytes(keys: range, first_label: int = 0) -> bytes:
    return b"".join(member(n, d) for k in keys for n, d in sample(f"k{k:02d}", k, (k + first_label) % 3)) + end()


# ---- the child process ------------------------------------------------------------------------------------

def run_child(spec: dict, tmp: Path, timeout: float = 240) -> dict:
    """Runs ``spec`` (see ``_run``) in a child process; returns its results, or fails the calling test on a
    hang, a crash or the memory watchdog."""
    import pytest

    spec_path, out = tmp / "spec.json", tmp / "out.json"
    spec_path.write_text(json.dumps(spec))
    try:
        done = subprocess.run([sys.executable, __file__, "run", str(spec_path), str(out)], capture_output=True,
                              text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading the shards did not finish within {timeout:.0f} s (a hang); last: "
                    f"{_last(out)}")
    if done.returncode == 86:
        pytest.fail(f"reading the shards passed {MEMORY_LIMIT >> 20} MiB of memory (a reader looping); last: "
                    f"{_last(out)}")
    if done.returncode != 0 or not out.exists():
        pytest.fail(f"the child died (exit {done.returncode}); last: {_last(out)}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def _last(out: Path) -> str:
    try:
        return Path(str(out) + ".log").read_text().splitlines()[-1]
    except (OSError, IndexError):
        return "nothing"


def _watchdog(limit: int) -> None:
    import psutil

    me = psutil.Process()
    while True:
        if me.memory_info().rss > limit:
            os._exit(86)
        time.sleep(0.05)


def _loader_outcome(paths: list[str], on_error: str) -> dict:
    import torch
    from feedline.loader import DataError, Loader
    from feedline.pipelines import image

    try:
        loader = Loader(image.train(paths, size=16, output="uint8"), batch_size=4, placement="cpu",
                        on_error=on_error, shuffle=False)
        where = list(loader.source.paths)
        delivered = []
        for batch in loader:
            valid = batch.get("valid", torch.ones(len(batch["index"]), dtype=torch.bool))
            delivered += batch["index"][valid].tolist()
        return {"where": where, "delivered": delivered, "labels": loader.source.labels.tolist(),
                "skipped": [[s.where, s.reason] for s in loader.skipped]}
    except DataError as err:
        return {"data_error": [err.where, err.reason]}
    except Exception as exc:  # noqa: BLE001  (recorded: the test says which kind was wrong)
        return {"other_error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc))[-2000:]}


def _source_outcome(path: str) -> dict:
    """Index one shard and read every sample with its header checked: what came of each."""
    from feedline.loader import DataError
    from feedline.loader.sources import open_source
    from feedline.pipelines.image_sources import WebDataset

    try:
        source = open_source(WebDataset((path,)))
    except ValueError as exc:
        return {"no_samples": str(exc)}
    except Exception as exc:  # noqa: BLE001
        return {"other_error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc))[-2000:]}
    samples = []
    for i in range(len(source)):
        try:
            data, _ = source.read_checked(i)
            samples.append(["ok", source.where(i), len(data)])
        except DataError as err:
            samples.append(["data_error", err.where, err.reason])
        except Exception as exc:  # noqa: BLE001
            samples.append(["other_error", source.where(i), f"{type(exc).__name__}: {exc}"])
    return {"samples": samples}


def _run(spec: dict, out: str) -> None:
    threading.Thread(target=_watchdog, args=(MEMORY_LIMIT,), daemon=True).start()
    import logging

    logging.getLogger("feedline").setLevel(logging.ERROR)
    results = {}
    with open(out + ".log", "w", buffering=1) as progress:
        for name, job in spec.items():
            progress.write(f"{name}\n")
            if job["kind"] == "loader":
                results[name] = _loader_outcome(job["paths"], job["on_error"])
            else:
                results[name] = _source_outcome(job["path"])
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        _run(json.loads(Path(sys.argv[2]).read_text()), sys.argv[3])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} run SPEC.json OUT.json")
