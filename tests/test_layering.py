"""Imports run one way: cli -> benchmarks -> datagen / loader -> pipelines -> ops, and inside loader
loader.py and the other top-level files -> placement -> runners -> sources; no cycle between files or packages.

Every import of every module is read with ``ast`` (absolute and relative, at the top or inside a function, and
``importlib.import_module`` of a literal name), so an import that would only run later still counts.
"""
from __future__ import annotations

import ast
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each installed package (feedline.<name>) and the others it may import. The library (loader, pipelines, ops)
# imports no benchmarks, datagen or cli; the benchmarks import no cli; datagen imports nothing of the runtime.
MAY_IMPORT = {
    "cli": {"benchmarks", "datagen", "loader", "pipelines", "ops"},
    "benchmarks": {"datagen", "loader", "pipelines", "ops"},
    "datagen": {"pipelines", "ops"},
    "loader": {"pipelines", "ops"},
    "pipelines": {"ops"},
    "ops": set(),
}
# Inside a package, its subpackages from the bottom up; the package's own files sit above them all.
SUBLAYERS = {
    "loader": ("sources", "runners", "placement"),
    "pipelines": ("imaging",),
}
# Modules that every layer of their package may import: each imports nothing else of its package, and counts as
# a package of its own in the cycle check (in loader/ and pipelines/ they sit beside the files of the top layer).
SHARED_LEAVES = {
    "loader.errors": "DataError and PlacementError, raised by every layer",
    "loader.skip_log": "the one log of skipped samples, written by sources, runners and the Loader",
    "loader.devices": "is there a GPU, and how many cores: asked by placement and the image runner",
    "loader.sampler": "the epoch's sample order, which runners, placement and the Loader share",
    "loader.cache_policy": "the cache settings and the decision to cache, shared by sources, runners and the Loader",
    "loader.wake_pipe": "the wake-up through a pipe that the batch thread and the feature workers' doorbell share",
    "loader.cpu_time": "the process's CPU seconds, read by the placement profiler, the image runner and benchmarks",
    "loader.byte_units": "byte counts as people read them, in the cache's decisions and placement's reasons",
    "loader.latency": "the short scheduler slice asked for the thread that takes a stream's batches",
    "loader.background": "a stream of batches made on a thread of its own: the Loader's, and a mix's per source",
    "loader.exit_joins": "the threads still ending that the batch threads' exit hook joins: batch and pool threads",
    "pipelines.stage": "the Stage declaration that image stages subclass",
    "pipelines.geometry": "crop and resize arithmetic shared by image stages",
    "pipelines.validate": "checks of argument values, shared by every layer",
}


@dataclass(frozen=True)
class Import:
    importer: str  # module names without the leading "feedline."
    target: str
    path: str  # the importer's file, relative to the root
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def installed_folders(root: Path = ROOT) -> dict[str, str]:
    """pyproject's package-dir: feedline.<name> -> folder."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    with open(root / "pyproject.toml", "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name.removeprefix("feedline."): folder for name, folder in package_dir.items()}


def find_modules(root: Path, folders: dict[str, str]) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__) for every .py file under the installed folders."""
    modules = {}
    for package, folder in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def load(root: Path, folders: dict[str, str]):
    modules = find_modules(root, folders)
    found, missing = set(), set()
    for item in _imports_with_names(root, modules):
        (found if isinstance(item, Import) else missing).add(item)
    return modules, sorted(found, key=lambda i: (i.path, i.line, i.target)), sorted(missing)


def _imports_with_names(root: Path, modules):
    """Imports resolved to modules: ``from package import name`` is the module package.name if there is one,
    else the package; a name that is neither is reported as missing (a string)."""
    for name, (path, is_package) in modules.items():
        relative = path.relative_to(root).as_posix()
        here = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target, line in _named(node, here):
                parent = target.rpartition(".")[0]
                if target in modules:
                    module = target
                elif isinstance(node, ast.ImportFrom) and parent in modules:
                    module = parent  # an attribute of the package or module
                else:
                    named = parent if isinstance(node, ast.ImportFrom) and parent else target
                    yield f"{relative}:{line}: {name} imports feedline.{named}, which does not exist"
                    continue
                if module != name:
                    yield Import(name, module, relative, line)


def _named(node: ast.AST, here: list[str]):
    """(module, line) for each feedline module that ``node`` imports; ``here`` is the importer's package."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith("feedline."):
                yield alias.name.removeprefix("feedline."), node.lineno
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            if node.level - 1 > len(here):
                yield "." * node.level + (node.module or ""), node.lineno  # above feedline: no such module
                return
            base = here[:len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
        elif node.module == "feedline" or (node.module or "").startswith("feedline."):
            base = node.module.split(".")[1:]
        else:
            return
        for alias in node.names:
            yield ".".join(base if alias.name == "*" else base + [alias.name]), node.lineno
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        name = node.args[0].value
        if function == "import_module" and isinstance(name, str) and name.startswith("feedline."):
            yield name.removeprefix("feedline."), node.lineno


def rank(module: str) -> int:
    """A module's layer inside its package: shared leaves -1, subpackages bottom-up from 0, the package's own
    files above them."""
    if module in SHARED_LEAVES:
        return -1
    top, _, rest = module.partition(".")
    layers = SUBLAYERS.get(top, ())
    sub = rest.partition(".")[0]
    return layers.index(sub) if sub in layers else len(layers)


def layer_name(module: str) -> str:
    if module in SHARED_LEAVES:
        return "a shared leaf"
    top, _, rest = module.partition(".")
    sub = rest.partition(".")[0]
    return f"{top}.{sub}" if sub in SUBLAYERS.get(top, ()) else f"{top}'s top layer"


def direction_violations(imports: list[Import]) -> list[str]:
    found = []
    for item in imports:
        top, target_top = item.importer.split(".")[0], item.target.split(".")[0]
        if top != target_top:
            if target_top not in MAY_IMPORT.get(top, set()):
                allowed = ", ".join(sorted(MAY_IMPORT.get(top, ()))) or "nothing"
                found.append(f"{item.where()}: {item.importer} imports {item.target}: {top} may import {allowed}")
        elif rank(item.importer) < rank(item.target):
            found.append(f"{item.where()}: {item.importer} ({layer_name(item.importer)}) imports {item.target} "
                         f"({layer_name(item.target)}), a layer above it")
    return found


def cycles(imports: list[Import], node_of) -> list[str]:
    """One cycle per strongly connected group of nodes (``node_of`` maps a module to its node), each edge shown
    with the first import that makes it."""
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for item in imports:
        a, b = node_of(item.importer), node_of(item.target)
        if a != b:
            edges[a].setdefault(b, item)
    found = []
    for group in _strongly_connected(edges):
        start = min(group)
        path = _shortest_cycle(start, edges, group)
        steps = [f"{a} -> {b} ({edges[a][b].where()}: {edges[a][b].importer} imports {edges[a][b].target})"
                 for a, b in zip(path, path[1:])]
        found.append("cycle: " + "; ".join(steps))
    return found


def _strongly_connected(edges: dict[str, dict[str, Import]]) -> list[set[str]]:
    nodes = sorted(set(edges) | {b for targets in edges.values() for b in targets})
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    for root in nodes:  # Tarjan's algorithm, iteratively
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _shortest_cycle(start: str, edges, group: set[str]) -> list[str]:
    before = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges.get(node, ())):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(before[path[-1]])
                return path[::-1] + [start]
            if child in group and child not in before:
                before[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")


def package_of(modules):
    def node(module: str) -> str:
        if module in SHARED_LEAVES:
            return module
        return module if modules[module][1] else module.rpartition(".")[0]
    return node


def check(root: Path, folders: dict[str, str]) -> list[str]:
    """Every import against the layers, missing modules, cycles between files and between packages."""
    modules, imports, missing = load(root, folders)
    leaves = [f"{leaf} is listed as a shared leaf but is no module" for leaf in SHARED_LEAVES
              if leaf.split(".")[0] in folders and leaf not in modules]
    return (leaves + missing + direction_violations(imports)
            + [f"between files, {c}" for c in cycles(imports, lambda m: m)]
            + [f"between packages, {c}" for c in cycles(imports, package_of(modules))])


# ---- the repository --------------------------------------------------------------------------------------------

def test_every_installed_package_has_a_layer():
    assert set(installed_folders()) == set(MAY_IMPORT)


def test_every_package_folder_is_installed():
    """pyproject lists every folder with an ``__init__.py`` (a package an editable install finds, a wheel would
    leave out)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        listed = set(pytest.importorskip("tomllib").load(f)["tool"]["setuptools"]["packages"])
    modules = find_modules(ROOT, installed_folders())
    assert {f"feedline.{name}" for name, (_, is_package) in modules.items() if is_package} == listed


def test_the_repository_follows_the_layers():
    problems = check(ROOT, installed_folders())
    assert not problems, "\n".join(problems)


def test_the_cli_is_no_part_of_the_library_and_the_library_imports_no_benchmarks():
    modules, imports, _ = load(ROOT, installed_folders())
    assert "loader.cli" not in modules and "benchmarks.data" not in modules
    library = {"loader", "pipelines", "ops"}
    assert not [i for i in imports if i.importer.split(".")[0] in library
                and i.target.split(".")[0] in {"benchmarks", "datagen", "cli"}]
    assert {"cli.make_data", "cli.convert", "cli.bench", "cli.plan", "datagen.synthetic_criteo", "datagen.images"} <= set(modules)


# ---- the check itself fails on planted bad imports -------------------------------------------------------------

def plant(root: Path, files: dict[str, str]) -> dict[str, str]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {package: package for package in MAY_IMPORT}


GOOD_TREE = {
    **{f"{p}/__init__.py": "" for p in MAY_IMPORT},
    "loader/sources/__init__.py": "", "loader/runners/__init__.py": "", "loader/placement/__init__.py": "",
    "pipelines/imaging/__init__.py": "",
    "ops/hashing.py": "import numpy\n",
    "pipelines/stage.py": "", "pipelines/geometry.py": "", "pipelines/validate.py": "", "loader/devices.py": "", "loader/sampler.py": "",
    "loader/cache_policy.py": "", "loader/wake_pipe.py": "", "loader/cpu_time.py": "",
    "loader/byte_units.py": "", "loader/background.py": "", "loader/latency.py": "", "loader/exit_joins.py": "",
    "loader/skip_log.py": "from .errors import DataError\n",
    "pipelines/spec.py": "from .. import ops\nfrom ..ops.hashing import murmur\n",
    "pipelines/imaging/crop.py": "from ..stage import Stage\n",
    "loader/errors.py": "from ..pipelines.spec import x\n",
    "loader/sources/tsv.py": "from ..errors import DataError\nfrom ...pipelines import spec\n",
    "loader/runners/features.py": "from ..sources.tsv import open_tsv\n",
    "loader/placement/auto.py": "from ..runners import features\nfrom ..sources import tsv\n",
    "loader/loader.py": "from .placement.auto import AutoPlacement\nfrom .errors import DataError\n",
    "datagen/criteo.py": "from feedline.pipelines.spec import x\n",
    "benchmarks/bench.py": "from ..loader.loader import Loader\nfrom ..datagen import criteo\n",
    "cli/command.py": "def run():\n    from ..benchmarks.bench import go\n    from feedline.loader import Loader\n",
}


def test_a_tree_that_follows_the_layers_passes(tmp_path):
    assert check(tmp_path, plant(tmp_path, GOOD_TREE)) == []


@pytest.mark.parametrize("name,text,expected", [
    ("ops/bad.py", "import numpy\n\ndef f():\n    from ..loader import loader\n",
     "ops/bad.py:4: ops.bad imports loader.loader: ops may import nothing"),
    ("pipelines/bad.py", "import importlib\nimportlib.import_module('feedline.datagen.criteo')\n",
     "pipelines/bad.py:2: pipelines.bad imports datagen.criteo: pipelines may import ops"),
    ("loader/bad.py", "from feedline.benchmarks import bench\n",
     "loader/bad.py:1: loader.bad imports benchmarks.bench: loader may import ops, pipelines"),
    ("loader/bad.py", "import feedline.cli.command\n", "loader/bad.py:1: loader.bad imports cli.command"),
    ("loader/bad.py", "from ..datagen.criteo import make\n", "loader/bad.py:1: loader.bad imports datagen.criteo"),
    ("datagen/bad.py", "from ..loader import loader\n", "datagen/bad.py:1: datagen.bad imports loader.loader"),
    ("benchmarks/bad.py", "def f():\n    from ..cli import command\n",
     "benchmarks/bad.py:2: benchmarks.bad imports cli.command: benchmarks may import datagen, loader, ops, pipelines"),
    ("loader/sources/bad.py", "from ..runners.features import x\n",
     "loader/sources/bad.py:1: loader.sources.bad (loader.sources) imports loader.runners.features (loader.runners), "
     "a layer above it"),
    ("loader/runners/bad.py", "from .. import loader\n",
     "loader/runners/bad.py:1: loader.runners.bad (loader.runners) imports loader.loader (loader's top layer)"),
    ("loader/placement/bad.py", "def f():\n    from ..loader import Loader\n",
     "loader/placement/bad.py:2: loader.placement.bad (loader.placement) imports loader.loader"),
    ("pipelines/imaging/bad.py", "from ..spec import x\n",
     "pipelines/imaging/bad.py:1: pipelines.imaging.bad (pipelines.imaging) imports pipelines.spec"),
    ("cli/bad.py", "from ..benchmarks.data.criteo import make_criteo\n",
     "cli/bad.py:1: cli.bad imports feedline.benchmarks.data.criteo, which does not exist"),
])
def test_an_import_against_the_layers_is_named_with_its_file_and_line(tmp_path, name, text, expected):
    problems = check(tmp_path, plant(tmp_path, {**GOOD_TREE, name: text}))
    assert any(p.startswith(expected) for p in problems), problems


def test_a_shared_leaf_that_imports_its_package_is_a_violation(tmp_path):
    problems = check(tmp_path, plant(tmp_path, {**GOOD_TREE, "loader/errors.py": "from .sources import tsv\n"}))
    assert any(p.startswith("loader/errors.py:1: loader.errors (a shared leaf) imports loader.sources")
               for p in problems), problems


def test_a_cycle_between_files_through_a_function_level_import_is_named(tmp_path):
    problems = check(tmp_path, plant(tmp_path, {
        **GOOD_TREE,
        "ops/a.py": "from .b import g\n",
        "ops/b.py": "def g():\n    from . import a\n",
    }))
    assert [p for p in problems if p.startswith("between files")] == [
        "between files, cycle: ops.a -> ops.b (ops/a.py:1: ops.a imports ops.b); "
        "ops.b -> ops.a (ops/b.py:2: ops.b imports ops.a)"]


def test_a_cycle_between_packages_without_a_cycle_between_files_is_named(tmp_path):
    problems = check(tmp_path, plant(tmp_path, {
        **GOOD_TREE,
        "benchmarks/top.py": "from .sub import low\n",
        "benchmarks/sub/__init__.py": "",
        "benchmarks/sub/low.py": "",
        "benchmarks/sub/high.py": "from .. import top\n",
    }))
    assert not [p for p in problems if p.startswith("between files")]
    assert problems == ["between packages, cycle: benchmarks -> benchmarks.sub (benchmarks/top.py:1: benchmarks.top "
                        "imports benchmarks.sub.low); benchmarks.sub -> benchmarks (benchmarks/sub/high.py:1: "
                        "benchmarks.sub.high imports benchmarks.top)"]


def test_the_check_finds_what_the_cli_inside_loader_did(tmp_path):
    """The layout before the CLI and the synthetic data left loader/ and benchmarks/: a package cycle."""
    problems = check(tmp_path, plant(tmp_path, {
        **GOOD_TREE,
        "loader/cli.py": "def bench():\n    from ..benchmarks.bench import go\n",
    }))
    assert "loader/cli.py:2: loader.cli imports benchmarks.bench: loader may import ops, pipelines" in problems
    assert any(p.startswith("between packages, cycle: benchmarks -> loader") for p in problems), problems
