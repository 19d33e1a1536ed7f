"""The library's shape (issue 19), checked on every run instead of once by hand: no class over 250 lines, no two
modules with the same file name, no private attribute of the Loader read outside ``loader/``, ``feedline.ops`` and
the scheduler importable without DALI, CuPy or numba, and a README "Architecture" section that names only modules,
classes and shared leaves the code has.

Each check is a function over a folder, so the tests at the end plant a tree that breaks it and see it fail."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from test_layering import SHARED_LEAVES, installed_folders

ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 250
# Where code that uses the library lives, besides its own packages.
USERS = ("tests", "examples")


def python_files(root: Path, folders) -> list[Path]:
    return [p for folder in folders for p in sorted((root / folder).rglob("*.py"))]


def long_classes(root: Path, folders) -> list[str]:
    found = []
    for path in python_files(root, folders):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: class {node.name} has {lines} lines")
    return found


def shared_file_names(root: Path, folders) -> list[str]:
    where = defaultdict(list)
    for path in python_files(root, folders):
        if path.name not in ("__init__.py", "__main__.py"):
            where[path.name].append(str(path.relative_to(root)))
    return [f"{name}: {', '.join(paths)}" for name, paths in sorted(where.items()) if len(paths) > 1]


def _private_names(tree: ast.AST, class_name: str | None = None) -> set[str]:
    """Single-underscore names a module (or one class of it) defines: methods, ``self._x`` and plain ``_x``."""
    if class_name is not None:
        tree = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def loader_reach_ins(root: Path, outside) -> list[str]:
    """Reads of the Loader's private attributes in files outside ``loader/``. A file that defines a name of the
    same spelling itself (its own class's ``_next``) reads its own."""
    private = _private_names(ast.parse((root / "loader" / "loader.py").read_text()), "Loader")
    found = []
    for path in python_files(root, outside):
        tree = ast.parse(path.read_text(), filename=str(path))
        reads = private - _private_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in reads:
                found.append(f"{path.relative_to(root)}:{node.lineno}: reads Loader.{node.attr}")
        for node in ast.walk(tree):  # getattr(loader, "_x")
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr")
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in reads):
                found.append(f"{path.relative_to(root)}:{node.lineno}: reads Loader.{node.args[1].value}")
    return found


def architecture_section(readme: str) -> str:
    start = readme.index("\n## Architecture\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end > 0 else None]


def architecture_mismatches(root: Path, folders, section: str, shared_leaves) -> list[str]:
    """Every ``name.py`` the section names is a module of the library, every ``CamelCase`` name a class (or
    enum) defined in it, and the section lists the shared leaves the layering check allows."""
    files = python_files(root, folders)
    by_name = defaultdict(list)
    for path in files:
        by_name[path.name].append(path)
    classes = {node.name for path in files for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef)}
    found = []
    for token in re.findall(r"`([^`]+)`", section):
        for word in re.findall(r"[\w/]+\.py\b", token):
            if not any(str(p.relative_to(root)).endswith(word) for p in by_name[Path(word).name]):
                found.append(f"the Architecture section names {word}, which is no module here")
        if re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+", token) and token not in classes:
            found.append(f"the Architecture section names {token}, which is no class of the library")
    leaves = sorted(leaf.split(".", 1)[1] for leaf in shared_leaves if leaf.startswith("loader."))
    missing = [leaf for leaf in leaves if f"`{leaf}`" not in section]
    if missing:
        found.append(f"the Architecture section does not list the shared leaves {missing} of loader/")
    return found


# ---- the repository ----------------------------------------------------------------------------------------------

def test_no_class_over_250_lines():
    assert long_classes(ROOT, installed_folders().values()) == []


def test_no_two_modules_share_a_file_name():
    assert shared_file_names(ROOT, installed_folders().values()) == []


def test_no_private_attribute_of_the_loader_is_read_outside_loader():
    outside = [f for f in installed_folders().values() if f != "loader"] + list(USERS)
    assert loader_reach_ins(ROOT, outside) == []


def test_the_architecture_section_agrees_with_the_code():
    section = architecture_section((ROOT / "README.md").read_text())
    folders = [*installed_folders().values(), *USERS]
    assert architecture_mismatches(ROOT, folders, section, SHARED_LEAVES) == []


def test_ops_and_the_scheduler_import_without_dali_cupy_or_numba():
    """Kernels load on first use: importing ``feedline.ops`` and the scheduler (what the GPU check machine, which
    has no DALI, runs) loads none of DALI, CuPy and numba."""
    code = ("import sys\n"
            "sys.modules['nvidia.dali'] = sys.modules['cupy'] = None\n"
            "import feedline.ops, feedline.loader.placement.scheduler\n"
            "print(sorted(m for m in ('nvidia.dali', 'cupy', 'numba') if sys.modules.get(m) is not None))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[]"


# ---- the checks fail on planted trees ----------------------------------------------------------------------------

def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


LOADER = ("class Loader:\n    def __init__(self):\n        self._stream = None\n        self.batch_size = 1\n"
          "    def _open(self):\n        pass\n")


def test_the_checks_name_what_breaks_them(tmp_path):
    long_body = "".join(f"    x{k} = {k}\n" for k in range(MAX_CLASS_LINES))
    _plant(tmp_path, {
        "loader/loader.py": LOADER,
        "loader/runners/maker.py": "class Maker:\n" + long_body,
        "pipelines/maker.py": "class Short:\n    pass\n",
        "tests/test_a.py": "def test(loader):\n    loader._stream.close()\n    getattr(loader, '_open')()\n"
                           "    loader.batch_size\n",
        "tests/test_b.py": "class Own:\n    def _open(self):\n        pass\n\ndef test(x):\n    x._open()\n",
    })
    assert long_classes(tmp_path, ["loader", "pipelines"]) == [
        f"loader/runners/maker.py:1: class Maker has {MAX_CLASS_LINES + 1} lines"]
    assert shared_file_names(tmp_path, ["loader", "pipelines"]) == [
        "maker.py: loader/runners/maker.py, pipelines/maker.py"]
    assert loader_reach_ins(tmp_path, ["pipelines", "tests"]) == [
        "tests/test_a.py:2: reads Loader._stream", "tests/test_a.py:3: reads Loader._open"]
    section = ("\n## Architecture\n`loader/runners/maker.py` (`Maker`), `gone.py` (`MissingClass`), shared: `errors`\n"
               "\n## Next\n`other.py`\n")
    assert architecture_mismatches(tmp_path, ["loader", "pipelines"], architecture_section(section),
                                   {"loader.errors": "", "loader.skip_log": ""}) == [
        "the Architecture section names gone.py, which is no module here",
        "the Architecture section names MissingClass, which is no class of the library",
        "the Architecture section does not list the shared leaves ['skip_log'] of loader/"]
