"""The names of the files feedline writes beside a user's data (indexes and their temporary files), so that
listing the data never takes them for data.

A sidecar of ``dir/name`` is ``dir/.name.feedline-<kind>``: hidden, so a glob such as ``dir/*`` or
``day_*`` never matches it, and recognisable, so a pattern that does reach hidden files (``dir/.*``) or a
listing of every file still leaves it out. Earlier versions wrote ``name.feedline-index.json`` (not hidden)
and ``.name.feedline-idx``; those are recognised too, so a folder they were left in lists the same data.
"""
from __future__ import annotations

import os
import re

SIDECAR_MARK = ".feedline-"
_OWN = re.compile(r"\.feedline-[a-z]+(\.json)?(\.[0-9]+\.[0-9a-f]+\.tmp|\.[0-9]+(\.[0-9]+)?\.tmp)?$")


def sidecar_name(name: str, kind: str) -> str:
    """The file name of ``name``'s sidecar of ``kind`` (lower-case letters)."""
    if not kind.isalpha() or not kind.islower():
        raise ValueError(f"a sidecar kind is lower-case letters, got {kind!r}")
    return f".{name}{SIDECAR_MARK}{kind}"


def is_own_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a file feedline writes itself (an index or its temporary file), now or in an
    earlier version."""
    return bool(_OWN.search(os.path.basename(os.fspath(path))))


def without_own_files(paths: list[str]) -> list[str]:
    return [p for p in paths if not is_own_file(p)]
