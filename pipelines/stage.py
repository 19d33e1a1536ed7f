"""Declaring a stage: what it consumes and produces and where it may run. Nothing here runs or allocates."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping


class Backend(enum.Enum):
    """Where a stage runs. For a DALI decoder, GPU means DALI's ``mixed`` device."""

    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class Stage:
    name: str
    consumes: tuple[str, ...]
    produces: tuple[str, ...]
    backends: frozenset[Backend] = frozenset({Backend.CPU, Backend.GPU})
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Stage.name must be a non-empty string")
        if not self.backends:
            raise ValueError(f"stage {self.name!r}: backends must name at least one Backend")
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def runs_on(self, backend: Backend) -> bool:
        return backend in self.backends
