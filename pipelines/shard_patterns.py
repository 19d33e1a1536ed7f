"""Naming webdataset tar shards: brace patterns (``shards/train-{0000..0127}.tar``), globs (``shards/*.tar``) and
lists of paths, resolved to the shard files in a fixed order.

Brace expansion follows ``braceexpand`` (which webdataset uses): ``{a,b,c}`` lists alternatives, ``{0..9}`` and
``{0000..0127}`` are integer ranges (a bound written with a leading zero pads every number to the wider bound's
width), ``{1..9..2}`` has a step, ``{a..e}`` is a letter range, braces nest, and a brace pair holding neither a
comma nor a range stays literal. Backslash has no special meaning (a file whose name holds braces is given in a
list). A glob never matches the files feedline writes beside shards (``pipelines.own_files``), even one that
reaches hidden files such as ``shards/.*``. Pure functions of the pattern and the file system; nothing here
reads a shard."""
from __future__ import annotations

import glob
import itertools
import os
import re

from .own_files import is_own_file

_INT_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?")
_CHAR_RANGE = re.compile(r"([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def has_braces(text: str) -> bool:
    return "{" in text or "}" in text


def has_glob(text: str) -> bool:
    return glob.has_magic(text)


def is_shard_spec(text: str) -> bool:
    """Whether a string names shards rather than a folder or a file list: braces or glob characters, or a name
    ending in ``.tar``."""
    return has_braces(text) or has_glob(text) or text.endswith(".tar")


def expand_braces(pattern: str) -> list[str]:
    """Every string ``pattern`` stands for, in order (the leftmost group varies slowest)."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    return [''.join(parts) for parts in itertools.product(*_parts(pattern, pattern))]


def _parts(text: str, pattern: str) -> list[list[str]]:
    """``text`` as a sequence of choices: a literal is one choice, a brace group its expansions."""
    parts: list[list[str]] = []
    depth, start, literal_from = 0, 0, 0
    for pos, char in enumerate(text):
        if char == "{":
            if depth == 0:
                if pos > literal_from:
                    parts.append([text[literal_from:pos]])
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced braces in shard pattern {pattern!r}: '}}' at position {pos} "
                                 f"closes nothing")
            if depth == 0:
                parts.extend(_group(text[start + 1:pos], pattern))
                literal_from = pos + 1
    if depth:
        raise ValueError(f"unbalanced braces in shard pattern {pattern!r}: {depth} '{{' never closed")
    if literal_from < len(text):
        parts.append([text[literal_from:]])
    return parts


def _group(body: str, pattern: str) -> list[list[str]]:
    """The choices of one brace group ``{body}``: a range, a comma list, or (neither) the literal braces around
    the expansions of ``body``."""
    match = _INT_RANGE.fullmatch(body)
    if match:
        return [_int_range(*match.groups())]
    match = _CHAR_RANGE.fullmatch(body)
    if match:
        return [_char_range(*match.groups())]
    items = _split_commas(body)
    if len(items) == 1:
        return [["{"], *_parts(body, pattern), ["}"]]
    return [[s for item in items for s in (''.join(p) for p in itertools.product(*_parts(item, pattern)))]]


def _split_commas(body: str) -> list[str]:
    items, depth, start = [], 0, 0
    for pos, char in enumerate(body):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(body[start:pos])
            start = pos + 1
    items.append(body[start:])
    return items


def _int_range(first: str, last: str, step: str | None) -> list[str]:
    padded = any(s.startswith(("0", "-0")) for s in (first, last) if s not in ("0", "-0"))
    width = max(len(first), len(last)) if padded else 0
    a, b, k = int(first), int(last), (int(step) if step else 0) or 1
    numbers = range(a, b + 1, k) if a < b else range(a, b - 1, -k)
    return [f"{n:0{width}d}" for n in numbers]


def _char_range(first: str, last: str, step: str | None) -> list[str]:
    a, b, k = _LETTERS.index(first), _LETTERS.index(last), (int(step) if step else 0) or 1
    return list(_LETTERS[a:b + 1:k]) if a < b else list(_LETTERS[a:(b - 1 if b > 0 else None):-k])


def shard_paths(shards: str | tuple[str, ...]) -> tuple[str, ...]:
    """The shard files that ``shards`` names, in order: a pattern's brace expansion in order, each glob's
    matches sorted by name; a tuple's paths as given. Raises FileNotFoundError naming a pattern that matches no
    file or a shard that does not exist, ValueError for an empty list or a directory."""
    if isinstance(shards, tuple):
        if not shards:
            raise ValueError("the list of shards is empty; give at least one .tar shard")
        for path in shards:
            _check_file(path, None)
        return shards
    names = expand_braces(shards) if has_braces(shards) else [shards]
    found: list[str] = []
    missing: list[str] = []
    for name in names:
        if has_glob(name):
            found.extend(sorted(m for m in glob.glob(name) if os.path.isfile(m) and not is_own_file(m)))
        elif os.path.isfile(name):
            found.append(name)
        elif os.path.isdir(name):
            _check_file(name, shards)
        else:
            missing.append(name)
    if names == [shards] and missing:
        raise FileNotFoundError(f"shard {shards!r} not found")
    if not found:
        shown = f" (it expands to {len(names)} names, first {names[0]!r})" if names != [shards] else ""
        raise FileNotFoundError(f"shard pattern {shards!r} matches no file{shown}")
    if missing:
        more = f"; {len(missing)} of the {len(names)} shards it names are missing" if len(missing) > 1 else ""
        raise FileNotFoundError(f"shard {missing[0]!r} (from pattern {shards!r}) not found{more}")
    return tuple(found)


def _check_file(path: str, pattern: str | None) -> None:
    source = f" (from pattern {pattern!r})" if pattern is not None else ""
    if os.path.isdir(path):
        raise ValueError(f"shard {path!r}{source} is a directory, not a tar file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"shard {path!r}{source} not found")
