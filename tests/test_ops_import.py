"""feedline.ops imports and works with neither CuPy nor DALI importable."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["cupy"] = None          # any 'import cupy' now raises ImportError
sys.modules["nvidia.dali"] = None
import numpy as np
import feedline.ops as ops
assert ops.murmur3_32(np.array([10], dtype=np.int64)).tolist() == [4004982076]
assert "nvidia.dali" not in {k for k, v in sys.modules.items() if v is not None}
print("ok")
"""


def test_import_without_cupy_or_dali():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
