"""The README runs as written.

Conventions the README follows (HTML comments, invisible when it is rendered, on the line before a fence):

- Every ```python block runs. The blocks of one ``## `` section run in order in one fresh Python process (a
  later block may use what an earlier one defined), in a folder holding the data the README names:
  ``data/images`` (an ImageFolder written by ``feedline make-data images``), ``day_0.tsv.gz`` and
  ``day_1.tsv.gz`` (Criteo, written by ``feedline make-data criteo``), ``data/criteo.tsv``, every file the
  README shows under ``<!-- file: NAME -->``, and the same rows as ``clicks.csv`` in ``clicks.tsv`` and
  ``clicks.parquet`` (``DERIVED``). A block that fails fails the test, with the README's line numbers in the
  traceback.
- ``<!-- not run: REASON -->``: a block that cannot run here (a Ray cluster, a GPU, torchrun). They are counted
  against ``NOT_RUN``, so a new one is a deliberate change to this file.
- ``<!-- needs: MODULE -->``: runs where MODULE imports (a package outside the library's dependencies), left
  out with a warning elsewhere.

Also: every ``feedline ...`` line of a shell block parses with the CLI's own parser (optional ``[...]`` parts
with and without them, each ``a|b`` alternative, placeholders such as ``N`` and ``DIR`` given values), and
every ``from feedline... import X`` and every ``feedline.a.b`` name the README shows exists.
"""
from __future__ import annotations

import ast
import contextlib
import csv
import importlib
import importlib.util
import io
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
NOT_RUN = {"Scale out: remote CPU workers on Ray": 1}
PLACEHOLDERS = {"N": "4", "C": "1", "MS": "50", "HOST:PORT": "127.0.0.1:6379", "DIR": "scratch"}
MARK = re.compile(r"<!--\s*(not run|needs|file):\s*(.*?)\s*-->")


@dataclass
class Block:
    section: str
    line: int  # of the block's first line of code in README.md
    lang: str
    text: str
    marks: dict[str, str] = field(default_factory=dict)


def read_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    section, marks, i = "", {}, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        found = MARK.fullmatch(line.strip())
        if found:
            marks[found.group(1)] = found.group(2)
            i += 1
            continue
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append(Block(section, i + 2, line[3:].strip(), "\n".join(lines[i + 1:end]) + "\n", marks))
            i, marks = end + 1, {}
            continue
        if line.strip():
            if marks:
                raise AssertionError(f"README.md:{i + 1}: a mark {marks} that is not followed by a code block")
        i += 1
    return blocks


BLOCKS = read_blocks(README.read_text())
PYTHON = [b for b in BLOCKS if b.lang == "python"]
SECTIONS = list(dict.fromkeys(b.section for b in PYTHON if "not run" not in b.marks))


def _clicks_rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "clicks.csv", newline="") as f:
        return list(csv.DictReader(f))


def _clicks_tsv(folder: Path) -> None:
    rows = _clicks_rows(folder)
    with open(folder / "clicks.tsv", "w", newline="") as f:
        f.write("\t".join(rows[0]) + "\n")
        f.writelines("\t".join(r.values()) + "\n" for r in rows)


def _clicks_parquet(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _clicks_rows(folder)

    def column(name, convert):
        return [convert(r[name]) if r[name] else None for r in rows]

    pq.write_table(pa.table({
        "clicked": pa.array(column("clicked", int), pa.int64()),
        "price": pa.array(column("price", float), pa.float64()),
        "age": pa.array(column("age", int), pa.int64()),
        "country": pa.array(column("country", str), pa.string()),
        "user": pa.array(column("user", str), pa.string()),
        "tags": pa.array([[int(t) for t in r["tags"].split("|")] if r["tags"] else [] for r in rows],
                         pa.list_(pa.int64()))}), folder / "clicks.parquet")


DERIVED = {"clicks.tsv": _clicks_tsv, "clicks.parquet": _clicks_parquet}


@pytest.fixture(scope="module")
def readme_folder(tmp_path_factory) -> Path:
    from feedline.datagen.synthetic_criteo import make_criteo
    from feedline.datagen.images import make_images

    folder = tmp_path_factory.mktemp("readme")
    make_images(folder / "data" / "images", count=12, classes=3, seed=0, progress=False, workers=1)
    make_criteo(folder / "data" / "criteo.tsv", rows=3000, seed=0)
    for day in range(2):
        make_criteo(folder / f"day_{day}.tsv.gz", rows=3000, seed=day)
    for block in BLOCKS:
        if "file" in block.marks:
            (folder / block.marks["file"]).write_text(block.text)
    for name, derive in DERIVED.items():
        derive(folder)
    (folder / PLACEHOLDERS["DIR"]).mkdir()
    return folder


def test_the_readme_has_the_blocks_this_test_expects():
    assert SECTIONS, "no Python block to run"
    not_run = {}
    for b in PYTHON:
        if "not run" in b.marks:
            assert b.marks["not run"], f"README.md:{b.line}: say why a block is not run"
            not_run[b.section] = not_run.get(b.section, 0) + 1
    assert not_run == NOT_RUN, "blocks marked not run changed; update NOT_RUN if that is meant"
    files = [b.marks["file"] for b in BLOCKS if "file" in b.marks]
    assert "clicks.csv" in files  # what DERIVED reads
    assert all(b.lang == "python" for b in BLOCKS if "needs" in b.marks)


@pytest.mark.parametrize("section", SECTIONS)
def test_the_python_blocks_of_a_section_run(section, readme_folder, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(readme_folder, workdir, symlinks=True)
    blocks, left_out = [], []
    for b in PYTHON:
        if b.section != section or "not run" in b.marks:
            continue
        needed = b.marks.get("needs")
        if needed and importlib.util.find_spec(needed) is None:
            left_out.append(f"README.md:{b.line} (needs {needed})")
            continue
        blocks.append((b.line, b.text))
    script = workdir / "readme_section.py"
    script.write_text(textwrap.dedent(f"""\
        blocks = {blocks!r}
        namespace = {{"__name__": "__main__"}}
        for line, text in blocks:
            print(f"--- README.md:{{line}}", flush=True)
            exec(compile("\\n" * (line - 1) + text, "README.md", "exec"), namespace)
        """))
    done = subprocess.run([sys.executable, str(script)], cwd=workdir, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"section {section!r} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    assert done.stdout.count("--- README.md:") == len(blocks)
    if left_out:
        warnings.warn(f"README blocks not run here: {', '.join(left_out)}")


def _variants(command: str) -> list[list[str]]:
    """The command with every ``[optional]`` part and without any, each ``a|b`` alternative in turn, and the
    placeholders given values."""
    forms = [re.sub(r"\[([^\]]*)\]", r"\1", command), re.sub(r"\s*\[[^\]]*\]", "", command)]
    out = []
    for form in forms:
        words = [PLACEHOLDERS.get(w, w) for w in shlex.split(form)]
        choices = [w.split("|") for w in words]
        for k in range(max(len(c) for c in choices)):
            variant = [c[min(k, len(c) - 1)] for c in choices]
            if variant not in out:
                out.append(variant)
    return out


FEEDLINE_LINES = [(b.line + k, line.split(" #")[0].strip())
                  for b in BLOCKS if b.lang in ("", "sh", "bash", "shell")
                  for k, line in enumerate(b.text.splitlines()) if line.startswith("feedline ")]


def test_the_readme_shows_feedline_commands():
    commands = {line.split()[1] for _, line in FEEDLINE_LINES}
    assert {"make-data", "convert", "bench", "plan"} <= commands


@pytest.mark.parametrize("where, command", FEEDLINE_LINES, ids=[f"line{n}" for n, _ in FEEDLINE_LINES])
def test_every_feedline_command_parses(where, command, readme_folder, monkeypatch):
    from feedline.cli.command import build_parser

    monkeypatch.chdir(readme_folder)
    for words in _variants(command):
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                build_parser().parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"README.md:{where}: {' '.join(words)!r} does not parse: {errors.getvalue().strip()}")


def _imports() -> list[tuple[int, str, str]]:
    """(line, module, name) of every ``from feedline... import name`` in the README's Python blocks and text."""
    found = []
    for b in PYTHON:
        for node in ast.walk(ast.parse(b.text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "feedline":
                found += [(b.line + node.lineno - 1, node.module, a.name) for a in node.names]
    for n, line in enumerate(README.read_text().splitlines(), 1):
        for module, names in re.findall(r"`from (feedline[\w.]*) import ([\w, ]+)`", line):
            found += [(n, module, name.strip()) for name in names.split(",")]
    return found


def _dotted_names() -> list[tuple[int, str]]:
    return [(n, name) for n, line in enumerate(README.read_text().splitlines(), 1)
            for name in re.findall(r"`(feedline(?:\.[A-Za-z_]\w*)+)", line)]


def test_every_import_the_readme_shows_exists():
    imports = _imports()
    assert {"Loader", "tabular", "TabularFiles", "criteo"} <= {name for _, _, name in imports}
    for line, module, name in imports:
        assert hasattr(importlib.import_module(module), name), f"README.md:{line}: {module} has no {name}"


def test_every_feedline_name_the_readme_shows_exists():
    names = _dotted_names()
    assert names
    for line, dotted in names:
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                target = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        for attribute in parts[cut:]:
            assert hasattr(target, attribute), f"README.md:{line}: {dotted} does not exist"
            target = getattr(target, attribute)


def test_the_marks_are_read():
    """The reader of the conventions itself: marks, sections, line numbers."""
    sample = "## One\n\n<!-- not run: needs a GPU -->\n```python\nx = 1\n```\n\n## Two\n```\nfeedline plan\n```\n"
    one, two = read_blocks(sample)
    assert (one.section, one.line, one.lang, one.text, one.marks) == ("One", 5, "python", "x = 1\n",
                                                                      {"not run": "needs a GPU"})
    assert (two.section, two.line, two.lang, two.marks) == ("Two", 10, "", {})
    with pytest.raises(AssertionError, match="not followed by a code block"):
        read_blocks("<!-- needs: torchrec -->\ntext\n```python\n```\n")
    assert _variants("feedline plan --data d [--placement auto|cpu] [--json N]") == [
        ["feedline", "plan", "--data", "d", "--placement", "auto", "--json", "4"],
        ["feedline", "plan", "--data", "d", "--placement", "cpu", "--json", "4"],
        ["feedline", "plan", "--data", "d"]]
