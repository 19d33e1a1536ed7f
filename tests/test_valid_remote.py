"""``valid`` is in every batch that remote workers make too (see test_valid_mask.py for local ones)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_images
from feedline.datagen.synthetic_criteo import make_criteo
from test_remote import _namespace_prefix

pytest.importorskip("ray", reason="Ray is not installed (pip install 'feedline[ray]')")


def test_remote_batches_carry_valid(tmp_path):
    prefix = _namespace_prefix()
    bad = write_images(tmp_path / "images", 10, classes=2, seed=5)
    bad[3].write_bytes(b"not an image")
    make_criteo(tmp_path / "criteo.tsv", rows=300, seed=0)
    out = tmp_path / "report.json"
    script = 'ip link set lo up 2>/dev/null || ifconfig lo up; exec "$0" "$1" "$2" "$3"'
    run = subprocess.run([*prefix, "sh", "-c", script, sys.executable,
                          str(Path(__file__).with_name("valid_remote_scenario.py")), str(tmp_path), str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    report = json.loads(out.read_text())
    listed = sorted(str(p) for p in (tmp_path / "images").rglob("*.jpg"))
    images, rows = report["images"], report["criteo"]
    assert images["remote_batches"] > 0 and rows["remote_batches"] > 0  # made by the Ray worker, not only locally
    assert images["checks"] and all(images["checks"]) and rows["checks"] and all(rows["checks"])
    assert sorted(images["delivered"]) == [i for i in range(10) if i != listed.index(str(bad[3]))]
    assert sorted(rows["delivered"]) == list(range(300))
