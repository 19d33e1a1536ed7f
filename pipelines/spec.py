"""A pipeline definition: a source, an ordered list of stages, named outputs, and the placements it allows.

Placement is never part of the definition. Data cannot return from the GPU to the CPU inside a pipeline,
so every placement is a single *cut*: stages before index ``cut`` run on the CPU, the rest on the GPU.
``cut == len(stages)`` is the all-CPU placement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .on_error import OnError, parse_on_error
from .stage import Backend, Stage


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    source: Any
    stages: tuple[Stage, ...]
    outputs: tuple[str, ...]
    default_shuffle: bool = True  # what a Loader given no ``shuffle`` does: False for evaluation pipelines
    on_error: OnError | None = None  # bad samples, if the definition says (None: the Loader's, else raise)

    def __post_init__(self) -> None:
        if not isinstance(self.default_shuffle, bool):
            raise TypeError(f"pipeline {self.name!r}: default_shuffle must be True or False, "
                            f"got {self.default_shuffle!r}")
        if self.on_error is not None:
            object.__setattr__(self, "on_error", parse_on_error(self.on_error))
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline {self.name!r}: stage names repeat: {names}")
        available = set(self.source_outputs)
        for stage in self.stages:
            missing = [c for c in stage.consumes if c not in available]
            if missing:
                raise ValueError(f"pipeline {self.name!r}: stage {stage.name!r} consumes {missing}, "
                                 f"which no earlier stage produces")
            available.update(stage.produces)
        missing = [o for o in self.outputs if o not in available]
        if missing:
            raise ValueError(f"pipeline {self.name!r}: outputs {missing} are never produced")

    @property
    def source_outputs(self) -> tuple[str, ...]:
        return tuple(getattr(self.source, "produces", ()))

    @property
    def all_cpu(self) -> int:
        return len(self.stages)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"pipeline {self.name!r} has no stage {name!r}; stages: {[s.name for s in self.stages]}")

    def valid_cuts(self) -> list[int]:
        """Every cut whose CPU part and GPU part each run only stages that support that backend."""
        cuts = []
        for cut in range(len(self.stages) + 1):
            cpu_ok = all(s.runs_on(Backend.CPU) for s in self.stages[:cut])
            gpu_ok = all(s.runs_on(Backend.GPU) for s in self.stages[cut:])
            if cpu_ok and gpu_ok:
                cuts.append(cut)
        return cuts

    def backends_at(self, cut: int) -> dict[str, Backend]:
        if cut not in self.valid_cuts():
            raise ValueError(f"pipeline {self.name!r}: cut {cut} is not a valid placement; "
                             f"valid cuts are {self.valid_cuts()}")
        return {s.name: (Backend.CPU if i < cut else Backend.GPU) for i, s in enumerate(self.stages)}

    def cut_from_mapping(self, mapping: Mapping[str, str | Backend]) -> int:
        """The cut that a per-stage mapping such as ``{"decode": "gpu"}`` describes.

        Stages left out of the mapping follow the single-cut rule: before the first GPU stage they run on
        the CPU, after it on the GPU.
        """
        index = {s.name: i for i, s in enumerate(self.stages)}
        chosen: dict[int, Backend] = {}
        for name, value in mapping.items():
            if name not in index:
                raise ValueError(f"placement names stage {name!r}, which pipeline {self.name!r} does not have; "
                                 f"stages: {list(index)}")
            try:
                chosen[index[name]] = value if isinstance(value, Backend) else Backend(value)
            except ValueError:
                raise ValueError(f"placement for stage {name!r} must be 'cpu' or 'gpu', got {value!r}") from None
        gpu = [i for i, b in chosen.items() if b is Backend.GPU]
        cut = min(gpu) if gpu else len(self.stages)
        late_cpu = [self.stages[i].name for i, b in chosen.items() if b is Backend.CPU and i > cut]
        if late_cpu:
            raise ValueError(f"placement puts {late_cpu} on the CPU after {self.stages[cut].name!r} on the GPU; "
                             f"data cannot return from the GPU inside a pipeline, so every stage after the "
                             f"first GPU stage must run on the GPU")
        if cut not in self.valid_cuts():
            bad = [s.name for i, s in enumerate(self.stages)
                   if not s.runs_on(Backend.CPU if i < cut else Backend.GPU)]
            raise ValueError(f"placement cannot run {bad} on the backends it implies; valid cuts: "
                             f"{[self.describe_cut(c) for c in self.valid_cuts()]}")
        return cut

    def describe_cut(self, cut: int) -> str:
        """``cpu`` for all on the CPU, ``gpu`` for the earliest cut, else ``gpu-from-<first GPU stage>``."""
        if cut >= len(self.stages):
            return "cpu"
        if cut == min(self.valid_cuts()):
            return "gpu"
        return f"gpu-from-{self.stages[cut].name}"
