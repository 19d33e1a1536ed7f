"""How the CPU kernels are compiled with numba. Only the kernel modules (``_*_numba.py``) import this, and
``_native.kernels`` imports those on first use, so ``import feedline.ops`` needs neither numba nor its compile
time.

Every kernel is ``nogil`` (the loader's threads run it side by side), uses NumPy's error model (a float
division by zero gives inf or NaN as in NumPy instead of raising), and never ``fastmath``: no reassociation and
no contraction of ``a * b + c`` into a fused multiply-add, so float results equal NumPy's bit for bit.

Compiled code is cached on disk where numba finds a writable place: ``NUMBA_CACHE_DIR`` when set, else the
package's ``__pycache__``, else the user's cache folder (``~/.cache/numba``). Where none is writable the
kernels compile on each start (about a second each, paid by the first batch).

A kernel found in that cache is loaded with less than numba's own load does (``fast_loading``), since a process's
first batch waits for every kernel it runs to load, one after the other (numba loads under one lock):

- no ``refresh`` of numba's target context: numba refreshes before every cache load, and the first refresh of a
  process imports every implementation numba has (arrays, typed containers, dates, linear algebra and, through
  numba's BLAS check, ``scipy.linalg``): ~0.45 s of one core holding the GIL and numba's compile lock;
- no compile of numba's runtime module (NRT): numba's first refresh compiles it with LLVM (~20 ms), but a cached
  kernel holds its own copies of the runtime functions it calls (every compile links them in), so loading needs
  only the runtime's C functions made known to LLVM. The module is compiled when numba itself asks for it (a
  compile);
- no import of the modules of the numba implementations a kernel was compiled from (``np.empty`` is one of
  ``numba.np.arrayobj``, which imports ~20 ms of numba): numba rebuilds each compiled function's environment
  from its module's globals, which compiled (nopython) code never reads; a module not imported yet gets an
  environment of its own name only;
- the kernel's LLVM bitcode (kept in the cache to link the kernel into a later compile, ~2-4 ms to parse for the
  large kernels) is parsed only when something asks for it; the machine code is loaded as numba loads it.

A compile (a cache miss, or a user's own numba function) still refreshes as numba always does, so nothing else
in the process sees a difference. Where this numba's internals are not the ones this was written for, kernels
load as numba loads them.
"""
from __future__ import annotations

import pickle
import sys

import numba

OPTIONS = {"nogil": True, "error_model": "numpy"}


def kernel(function):
    """``function`` compiled as a cached, GIL-free numba kernel (uncached where no cache folder is writable)."""
    try:
        return fast_loading(numba.njit(cache=True, **OPTIONS)(function))
    except RuntimeError:  # numba found no writable cache location
        return numba.njit(cache=False, **OPTIONS)(function)


def helper(function):
    """A function the kernels of the same module call (compiled into them: keep helpers beside their kernels,
    since numba's cache checks only the calling kernel's own file for changes)."""
    return numba.njit(**OPTIONS)(function)


def fast_loading(dispatcher):
    """``dispatcher`` (a cached ``numba.njit`` function, nopython, no ``objmode``, not ``parallel``) with its
    cache loading compiled code as the module's docstring says. The cache files, their keys and what is compiled
    are numba's own. Where this numba's cache is not the one this was written for, the dispatcher is left as it
    is."""
    cache = getattr(dispatcher, "_cache", None)
    quick = _quick_cache_class()
    if quick is not None and type(cache) is quick.__bases__[0]:
        dispatcher._cache = quick(dispatcher.py_func)
    return dispatcher


_QUICK: list = []


def _quick_cache_class():
    if not _QUICK:
        _QUICK.append(_make_quick_cache_class())
        _type_arrays_without_numpy_ma()
    return _QUICK[0]


def _type_arrays_without_numpy_ma() -> None:
    """numba types an ndarray argument (a kernel's first call with those types) after checking that it is no
    ``numpy.ma.MaskedArray``, which imports ``numpy.ma`` (~9 ms holding the GIL, while a process's first batch is
    being made). An array whose type is exactly ``np.ndarray`` is no masked array: it is typed here as numba types
    it, without the check; any other array is left to numba's own typing."""
    try:
        import numpy as np
        from numba.core import errors, types
        from numba.core.typing.typeof import typeof_impl
        from numba.np import numpy_support
    except ImportError:
        return
    numbas = typeof_impl.dispatch(np.ndarray)
    if getattr(numbas, "__name__", None) != "_typeof_ndarray":  # not numba's as this was written for
        return

    def typeof_array(val, c):
        if type(val) is not np.ndarray:
            return numbas(val, c)
        try:
            dtype = numpy_support.from_dtype(val.dtype)
        except errors.NumbaNotImplementedError:
            return numbas(val, c)
        return types.Array(dtype, val.ndim, numpy_support.map_layout(val), readonly=not val.flags.writeable)

    typeof_impl.register(np.ndarray)(typeof_array)


_CR_FIELDS = ("typing_context", "target_context", "entry_point", "typing_error", "type_annotation", "signature", "objectmode",
              "lifted", "fndesc", "library", "call_helper", "environment", "metadata", "reload_init",
              "referenced_envs")


def _make_quick_cache_class():
    try:
        from numba.core import compiler
        from numba.core.caching import FunctionCache, IndexDataCacheFile
        from numba.core.codegen import JITCodeLibrary, JitEngine
        from numba.core.environment import Environment, _rebuild_env, lookup_environment
        from numba.core.runtime import _nrt_python
        from numba.core.runtime.nrt import rtsys
        from llvmlite import binding as ll
    except ImportError:
        return None
    if not all(hasattr(FunctionCache, name) for name in ("_load_overload", "_guard_against_spurious_io_errors",
                                                         "_index_key")) \
            or not all(hasattr(IndexDataCacheFile, name) for name in ("_load_index", "_data_path")) \
            or not all(hasattr(JITCodeLibrary, name) for name in ("enable_object_caching", "_set_compiled_object",
                                                                  "_finalize_final_module", "_get_module_for_linking",
                                                                  "get_pointer_to_function")) \
            or not hasattr(JitEngine, "_load_defined_symbols") \
            or not hasattr(rtsys, "initialize") or set(compiler.CR_FIELDS) != set(_CR_FIELDS):
        return None
    c_helpers = getattr(_nrt_python, "c_helpers", None)
    # numba versions whose runtime took its atomic operations from the compiled module need it compiled
    lazy_runtime = isinstance(c_helpers, dict) and not hasattr(_nrt_python, "memsys_set_atomic_inc_dec")
    symbols_added: list = []

    def runtime_ready(target_context) -> None:
        """What loading compiled code needs of numba's runtime (NRT): its C functions known to LLVM by name (as
        ``rtsys.initialize`` makes them known before it compiles the runtime's own module)."""
        if symbols_added or getattr(rtsys, "_init", False):
            return
        if not lazy_runtime:
            rtsys.initialize(target_context)
            return
        for py_name, address in c_helpers.items():
            ll.add_symbol(py_name if py_name.startswith("_") else "NRT_" + py_name, address)
        symbols_added.append(True)

    def environment(modname, consts, env_name):
        """numba's ``_rebuild_env`` without importing a module not imported yet (see the module's docstring)."""
        if modname is None or modname in sys.modules or lookup_environment(env_name) is not None:
            return _rebuild_env(modname, consts, env_name)
        env = Environment({"__name__": modname})
        env.consts[:] = consts
        env.env_name = env_name
        Environment._memo[env_name] = env
        return env

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module == "numba.core.environment" and name == "_rebuild_env":
                return environment
            return super().find_class(module, name)

    class QuickLibrary(JITCodeLibrary):
        """A library loaded from the cache whose bitcode is parsed only when asked for (to link it into a
        compile, or to find a symbol by name)."""

        _shared_bitcode = None

        def _parse_shared(self) -> None:
            if self._shared_module is None and self._shared_bitcode is not None:
                self._shared_module = ll.parse_bitcode(self._shared_bitcode)
                self._shared_bitcode = None
                self._codegen._engine._load_defined_symbols(self._shared_module)

        def _get_module_for_linking(self):
            self._parse_shared()
            return super()._get_module_for_linking()

        def get_pointer_to_function(self, name):
            address = super().get_pointer_to_function(name)
            if not address and self._shared_bitcode is not None:
                self._parse_shared()
                address = super().get_pointer_to_function(name)
            return address

    def library_of(codegen, libdata, fndesc):
        name, kind, data = libdata
        if kind != "object" or getattr(codegen, "_library_class", None) is not JITCodeLibrary \
                or not isinstance(getattr(getattr(codegen, "_engine", None), "_defined_symbols", None), set):
            return codegen.unserialize_library(libdata)
        object_code, shared_bitcode = data
        library = QuickLibrary(codegen, name)
        library.enable_object_caching()
        library._set_compiled_object(object_code)
        library._shared_bitcode = shared_bitcode
        library._finalize_final_module()
        # the names numba looks the compiled function up by (others: ``get_pointer_to_function`` parses the rest)
        codegen._engine._defined_symbols.update((fndesc.llvm_cpython_wrapper_name, fndesc.llvm_func_name))
        return library

    def rebuild(target_context, libdata, fndesc, env, signature, objectmode, lifted, typeann, reload_init,
                referenced_envs):
        """numba's ``CompileResult._rebuild`` with the library of ``library_of``."""
        for fn in reload_init or ():
            fn()
        library = library_of(target_context.codegen(), libdata, fndesc)
        cres = compiler.CompileResult(
            target_context=target_context, typing_context=target_context.typing_context, library=library,
            environment=env, entry_point=target_context.get_executable(library, fndesc, env), fndesc=fndesc,
            type_annotation=typeann, signature=signature, objectmode=objectmode, lifted=lifted, typing_error=None,
            call_helper=None, metadata=None, reload_init=reload_init, referenced_envs=referenced_envs)
        for referenced in referenced_envs:
            library.codegen.set_env(referenced.env_name, referenced)
        return cres

    class QuickFunctionCache(FunctionCache):
        """numba's ``FunctionCache`` whose ``load_overload`` loads as the module's docstring says (the rest of
        ``Cache.load_overload`` as numba has it)."""

        def load_overload(self, sig, target_context):
            runtime_ready(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)

        def _load_overload(self, sig, target_context):
            if not self._enabled:
                return None
            files = self._cache_file
            name = files._load_index().get(self._index_key(sig, target_context.codegen()))
            if name is None:
                return None
            try:
                with open(files._data_path(name), "rb") as f:
                    payload = Unpickler(f).load()
            except OSError:  # removed while the index still named it (as numba's own load)
                return None
            if len(payload) != 9:
                return self._impl.rebuild(target_context, payload)
            return rebuild(target_context, *payload)

    return QuickFunctionCache
