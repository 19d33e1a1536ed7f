"""Declaring a stage: what it consumes and produces and where it may run. Nothing here runs or allocates."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Backend(enum.Enum):
    """Where a stage runs. For a DALI decoder, GPU means DALI's ``mixed`` device."""

    CPU = "cpu"
    GPU = "gpu"


BOTH = frozenset({Backend.CPU, Backend.GPU})
CPU_ONLY = frozenset({Backend.CPU})


def parse_backends(owner: str, value) -> frozenset[Backend]:
    """``"cpu"``, ``"gpu"``, a Backend, or a collection of them -> a non-empty frozenset of Backend."""
    items = (value,) if isinstance(value, (str, Backend)) else value
    try:
        backends = frozenset(b if isinstance(b, Backend) else Backend(b) for b in items)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: backends must be 'cpu', 'gpu' or a collection of them, got {value!r}") from None
    if not backends:
        raise ValueError(f"{owner}: backends must name at least one of 'cpu' and 'gpu'")
    return backends


class Stage:
    """What every stage declares: ``name``, the data it ``consumes`` and ``produces`` (names that earlier
    stages or the source produce), and the ``backends`` it can run on."""

    name: str
    consumes: tuple[str, ...]
    produces: tuple[str, ...]
    backends: frozenset[Backend]

    def runs_on(self, backend: Backend) -> bool:
        return backend in self.backends

    def describe(self) -> str:
        """What the stage does, in a few words (for placement tables)."""
        return self.name


@dataclass(frozen=True)
class PlainStage(Stage):
    """A stage that is only a declaration (data flow and backends), for graphs the scheduler reasons about."""

    name: str
    consumes: tuple[str, ...]
    produces: tuple[str, ...]
    backends: frozenset[Backend] = BOTH

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("Stage.name must be a non-empty string")
        object.__setattr__(self, "backends", parse_backends(f"stage {self.name!r}", self.backends))
