"""Kernels found in numba's disk cache load without numba's refresh of its whole target context
(``ops._numba.fast_loading``): in a fresh process, a cached kernel that allocates, loops and raises runs and
gives its results with none of numba's other implementations imported (no ``arraymath``, no ``scipy.linalg``, not
even ``arrayobj`` of its own ``np.empty``) and numba's runtime module not compiled, and a user's own numba
function compiled afterwards in that process (``np.dot``, ``np.sum``: the implementations the refresh installs;
one calling the loaded kernel) still compiles and runs. A Criteo TSV epoch in a fresh process loads its kernels that way."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

KERNELS = textwrap.dedent('''
    import numpy as np
    from feedline.ops._numba import kernel

    @kernel
    def squares(out, n):
        if n > out.shape[0]:
            raise ValueError("n is larger than out")
        tmp = np.empty(n, np.int64)
        for i in range(n):
            tmp[i] = i * i
        total = 0
        for i in range(n):
            out[i] = tmp[i]
            total += tmp[i]
        return total
''')

RUN = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import fast_kernels
    out = np.zeros(5, np.int64)
    total = fast_kernels.squares(out, 5)
    try:
        fast_kernels.squares(out, 6)
        raised = None
    except ValueError as e:
        raised = str(e)
    result = {"total": int(total), "out": out.tolist(), "raised": raised,
              "hits": sum(fast_kernels.squares.stats.cache_hits.values()),
              "cache": type(fast_kernels.squares._cache).__name__,
              "refreshed": [m for m in ("numba.np.arraymath", "numba.np.linalg", "scipy.linalg") if m in sys.modules],
              "arrayobj": "numba.np.arrayobj" in sys.modules, "numpy_ma": "numpy.ma" in sys.modules}
    from numba import typeof
    readonly = np.arange(6.0).reshape(2, 3)[:, ::2]
    readonly.flags.writeable = False
    result["typed"] = [str(typeof(a)) for a in (np.zeros(3, np.int64), readonly, np.zeros((2, 2), order="F"))]
    try:
        typeof(np.ma.array(np.zeros(5, np.int64)))
        result["masked"] = None
    except Exception as e:
        result["masked"] = type(e).__name__
    from numba.core.runtime.nrt import rtsys
    result["runtime_compiled"] = rtsys._init
    import numba

    @numba.njit
    def calls_the_kernel(out):
        return fast_kernels.squares(out, 4)

    result["called"] = calls_the_kernel(np.zeros(5, np.int64))

    @numba.njit
    def users_own(a, b):
        return np.dot(a, b) + np.sum(a)

    result["users_own"] = users_own(np.ones(3), np.full(3, 2.0))
    result["refreshed_after"] = "numba.np.arraymath" in sys.modules
    print(json.dumps(result))
''')


def _run(folder) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, str(folder)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cached_kernel_loads_without_refreshing_numba_and_numba_still_compiles(tmp_path):
    (tmp_path / "fast_kernels.py").write_text(KERNELS)
    first = _run(tmp_path)  # compiles (numba's own refresh) and saves
    assert first["hits"] == 0 and first["total"] == 30 and first["out"] == [0, 1, 4, 9, 16]
    second = _run(tmp_path)  # a fresh process: loaded from the cache
    assert second["cache"] == "QuickFunctionCache"
    assert second["hits"] == 1
    assert second["total"] == 30 and second["out"] == [0, 1, 4, 9, 16]
    assert second["raised"] == "n is larger than out"
    assert second["refreshed"] == []
    assert second["users_own"] == 9.0 and second["refreshed_after"]


def test_a_cached_kernel_loads_without_the_runtime_module_or_its_implementations_modules(tmp_path):
    """Loading needs neither numba's runtime module compiled nor ``numba.np.arrayobj`` (where ``np.empty``, which
    the kernel calls, is implemented) imported; a numba function compiled afterwards that calls the loaded kernel
    links it (its bitcode, parsed only then) and runs it."""
    (tmp_path / "fast_kernels.py").write_text(KERNELS)
    first = _run(tmp_path)
    assert first["arrayobj"] and first["runtime_compiled"] and first["called"] == 14
    second = _run(tmp_path)
    assert second["hits"] == 1
    assert not second["arrayobj"] and not second["runtime_compiled"]
    assert second["called"] == 14


def test_arrays_are_typed_without_importing_numpy_ma_and_masked_arrays_are_still_refused(tmp_path):
    """numba's typing of an array argument checks for a masked array, which imports ``numpy.ma``; an exact
    ``np.ndarray`` is typed without it, and a masked array is refused as numba refuses it."""
    (tmp_path / "fast_kernels.py").write_text(KERNELS)
    _run(tmp_path)
    second = _run(tmp_path)
    assert second["total"] == 30 and not second["numpy_ma"]
    assert second["typed"] == ["array(int64, 1d, C)", "readonly array(float64, 2d, A)", "array(float64, 2d, F)"]
    assert second["masked"] == "NumbaTypeError"


EPOCH = textwrap.dedent('''
    import json, sys
    from feedline.loader import Loader
    from feedline.pipelines.criteo import criteo
    loader = Loader(criteo(sys.argv[1], table_sizes=1000), 512, placement="cpu", shuffle=True, seed=0, cache="off")
    rows = sum(int(b["label"].shape[0]) for b in loader)
    loader.close()
    print(json.dumps({"rows": rows, "refreshed": [m for m in ("numba.np.arraymath", "scipy.linalg") if m in sys.modules]}))
''')


def test_a_criteo_tsv_epoch_in_a_fresh_process_never_refreshes_numba(tmp_path):
    """Once its kernels are in numba's cache (the first run compiles whatever is not), a process reading a Criteo
    TSV epoch imports none of numba's arraymath or scipy.linalg: every kernel on that path loads without numba's
    refresh, and none names an implementation that imports them (an array method such as ``.min()`` would)."""
    from feedline.datagen.synthetic_criteo import make_criteo

    path = tmp_path / "c.tsv"
    make_criteo(path, 3000, seed=0)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", EPOCH, str(path)], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[1] == {"rows": 3000, "refreshed": []}
