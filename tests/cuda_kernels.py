"""What the CUDA side of feedline.ops defines and what the Python side launches, read from the sources.

Shared by tests/test_cuda_sources.py and tests/test_ops_emulated_gpu.py so that neither hard-codes
kernel names:

* ``kernel_signatures(text)``: the ``extern "C" __global__`` kernels of a kernel source, found after
  running the C preprocessor over it (kernels may be stamped out by macros), with their parameters.
* ``launch_sites()``: every ``launch(file, name, n, args)`` call in ops/*.py, with the kernel name
  turned into regular expressions: a variable is resolved to the strings assigned to it in the calling
  function; an f-string field becomes the string literals its variable can hold (also through a
  tuple returned by a helper in the same module), ``[0-9]+`` for arithmetic, else ``[A-Za-z0-9]+``.
* ``c_functions(text)``, ``int_literals(body)``, ``hex_float_literals(body)``: a light C reader for
  checking the constants in the kernel sources.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from feedline.ops import _cuda

KERNEL_DIR = _cuda.KERNEL_DIR
CU_FILES = tuple(sorted(p.name for p in KERNEL_DIR.glob("*.cu")))
CXX = next((c for c in (shutil.which(n) for n in ("g++", "c++", "clang++")) if c), None)

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)\s*\{')
_FIELD = "[A-Za-z0-9]+"


@functools.cache
def preprocess(text: str) -> str:
    """``text`` run through the C preprocessor (host side: ``__CUDA_ARCH__`` undefined), no line markers.

    Only the text itself is read: an ``#include "..."`` left in it fails here, as it would in NVRTC.
    """
    if CXX is None:
        raise RuntimeError("no C++ compiler (g++, c++, clang++) to preprocess CUDA sources")
    result = subprocess.run([CXX, "-E", "-P", "-x", "c++", "-"], input=text, capture_output=True,
                            text=True, cwd="/", check=False)
    if result.returncode != 0:
        raise AssertionError(f"preprocessing failed:\n{result.stderr}")
    return result.stdout


def split_params(params: str) -> list[str]:
    return [" ".join(p.split()) for p in params.split(",") if p.strip()]


def kernel_signatures(text: str) -> dict[str, list[str]]:
    """``{kernel name: [parameter declarations]}`` of the ``extern "C" __global__ void`` kernels in ``text``.

    Every ``__global__`` in the preprocessed text must belong to such a kernel: a C++-mangled or
    otherwise unrecognised kernel fails here instead of being silently left out.
    """
    expanded = preprocess(text)
    found = _KERNEL.findall(expanded)
    total = len(re.findall(r"\b__global__\b", expanded))
    assert total == len(found), (
        f"{total} __global__ functions but {len(found)} of the form extern \"C\" __global__ void f(...) {{")
    names = [name for name, _ in found]
    assert len(set(names)) == len(names), f"kernel defined twice: {names}"
    return {name: split_params(params) for name, params in found}


@functools.cache
def file_kernels(filename: str) -> dict[str, tuple[str, ...]]:
    """Kernels that NVRTC sees in ``filename``, i.e. in ``_cuda.kernel_source(filename)``."""
    return {k: tuple(v) for k, v in kernel_signatures(_cuda.kernel_source(filename)).items()}


@dataclass(frozen=True)
class LaunchSite:
    module: str  # ops/<module>.py
    line: int
    file: str  # the .cu file named in the call
    patterns: tuple[str, ...]  # regular expressions the kernel name fully matches (one per candidate)
    args: ast.expr | None  # the launch's argument tuple expression

    @property
    def where(self) -> str:
        return f"ops/{self.module}:{self.line}"

    def matches(self, kernel: str) -> bool:
        return any(re.fullmatch(p, kernel) for p in self.patterns)


def _is_launch(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "launch") or (
        isinstance(func, ast.Attribute) and func.attr == "launch")


def _assigned_values(name: str, scope: ast.AST, module: ast.Module) -> list[ast.expr] | None:
    """Expressions assigned to ``name`` in ``scope``: ``name = e``, ``a, name = e1, e2``, and
    ``a, name = f(...)`` with ``f`` a function of ``module`` (the matching element of each tuple it
    returns). None when some assignment cannot be followed."""
    functions = {f.name: f for f in module.body if isinstance(f, ast.FunctionDef)}
    values: list[ast.expr] = []
    for assign in ast.walk(scope):
        if not isinstance(assign, ast.Assign):
            continue
        for target in assign.targets:
            if isinstance(target, ast.Name) and target.id == name:
                values.append(assign.value)
                continue
            if not (isinstance(target, ast.Tuple) and any(
                    isinstance(t, ast.Name) and t.id == name for t in target.elts)):
                continue
            index = next(i for i, t in enumerate(target.elts) if isinstance(t, ast.Name) and t.id == name)
            value = assign.value
            if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                values.append(value.elts[index])
            elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                  and value.func.id in functions):
                returns = [r.value for r in ast.walk(functions[value.func.id]) if isinstance(r, ast.Return)]
                if not all(isinstance(r, ast.Tuple) and len(r.elts) == len(target.elts) for r in returns):
                    return None
                values += [r.elts[index] for r in returns]
            else:
                return None
    return values or None


def _field_pattern(node: ast.expr, scope: ast.AST, module: ast.Module) -> str:
    """An f-string field: the alternatives of the string literals it can hold, digits for arithmetic
    (``8 * itemsize``), else any word."""
    values = _assigned_values(node.id, scope, module) if isinstance(node, ast.Name) else [node]
    if values and all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values):
        return "(?:" + "|".join(sorted({re.escape(v.value) for v in values})) + ")"
    if values and all(isinstance(v, ast.BinOp) or (isinstance(v, ast.Constant) and type(v.value) is int)
                      for v in values):
        return "[0-9]+"
    return _FIELD


def _name_patterns(node: ast.expr, scope: ast.AST, module: ast.Module, where: str) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [re.escape(node.value)]
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(re.escape(value.value))
            else:
                assert isinstance(value, ast.FormattedValue)
                parts.append(_field_pattern(value.value, scope, module))
        return ["".join(parts)]
    if isinstance(node, ast.IfExp):
        return (_name_patterns(node.body, scope, module, where)
                + _name_patterns(node.orelse, scope, module, where))
    if isinstance(node, ast.Name):
        values = _assigned_values(node.id, scope, module)
        assert values, f"{where}: cannot tell which kernel the variable {node.id!r} names"
        return [p for v in values for p in _name_patterns(v, scope, module, where)]
    raise AssertionError(f"{where}: kernel name given as {ast.dump(node)}, which this test cannot read")


def launch_sites(directory: Path = KERNEL_DIR) -> list[LaunchSite]:
    sites = []
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and _is_launch(call)):
                continue
            where = f"ops/{path.name}:{call.lineno}"
            args = list(call.args) + [kw.value for kw in call.keywords]
            assert len(args) == 4, f"{where}: launch() takes (file, kernel, n, args)"
            file_arg, name_arg, _, launch_args = args
            assert isinstance(file_arg, ast.Constant) and isinstance(file_arg.value, str), (
                f"{where}: the kernel file must be a string literal")
            scope = call
            while scope in parents and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = parents[scope]
            sites.append(LaunchSite(path.name, call.lineno, file_arg.value,
                                    tuple(_name_patterns(name_arg, scope, tree, where)), launch_args))
    return sites


# --- a light C reader for constants ---------------------------------------------------------------

def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", text)


def c_functions(text: str) -> dict[str, str]:
    """``{name: body}`` of the functions defined at top level of a (comment-free) C source."""
    text = strip_comments(text)
    out = {}
    for match in re.finditer(r"\b(\w+)\s*\([^;{}()]*\)\s*\{", text):
        if match.group(1) in ("if", "for", "while", "switch"):
            continue
        depth, i = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.setdefault(match.group(1), text[match.end():i - 1])
    return out


_INT = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)[uUlL]*(?![\w.])")
_HEX_FLOAT = re.compile(r"(?<![\w.])0[xX][0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?[pP][-+]?\d+")
_DEC_FLOAT = re.compile(r"(?<![\w.])(?:\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)[fFlL]?")
_UNARY_BEFORE = set("(,=<>!&|?:+-*/%^~[{;")


def int_literals(body: str) -> list[int]:
    """Integer literals in order (hex or decimal, suffixes dropped; float literals excluded)."""
    body = _DEC_FLOAT.sub(" ", _HEX_FLOAT.sub(" ", body))
    return [int(m.group(1), 0) for m in _INT.finditer(body)]


def dec_float_literals(body: str) -> list[float]:
    """Decimal float literals (``1.0``, ``1e5``) in order, without sign."""
    return [float(m.group(0).rstrip("fFlL")) for m in _DEC_FLOAT.finditer(_HEX_FLOAT.sub(" ", body))]


def hex_float_literals(body: str) -> list[float]:
    """Hexadecimal float literals in order, negated where a unary minus precedes them."""
    values = []
    for match in _HEX_FLOAT.finditer(body):
        value = float.fromhex(match.group(0))
        before = body[:match.start()].rstrip()
        if before.endswith("-"):
            prior = before[:-1].rstrip()
            if not prior or prior[-1] in _UNARY_BEFORE:
                value = -value
        values.append(value)
    return values
