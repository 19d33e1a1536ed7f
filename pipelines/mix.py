"""A mix of named sources drawn at set weights: one pipeline definition over several.

```python
from feedline.pipelines import image, mix

spec = mix({"web": image.train("/data/web"), "curated": image.train("/data/curated", scale=(0.3, 1))},
           weights={"web": 0.7, "curated": 0.3})
```

Each source keeps its own pipeline (stages, augmentation), its own order and its own epochs; the Loader draws
them in exact proportion over every window of ``window`` samples (``feedline.loader.mix_order``). The sources'
outputs must be of one type (the same keys; images of one dtype, layout and size; tables of one schema), which
is checked here, when the mix is defined.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Mapping

from .choices import parse_enum
from .image_sources import ImageSource
from .spec import PipelineSpec
from .tabular import TabularFiles
from .validate import positive_int

DEFAULT_WINDOW = 1000


class MixEnd(enum.Enum):
    """When a mixed epoch ends. SAMPLES: after ``samples`` samples (default: the sources' sizes added up).
    FIRST: when the first source comes to the end of its own epoch. ALL: when every source has come to the end
    of the own epoch it was in when the mixed epoch began (those that finish earlier start their next)."""

    SAMPLES = "samples"
    FIRST = "first"
    ALL = "all"


@dataclass(frozen=True)
class MixSpec(PipelineSpec):
    """A ``PipelineSpec`` whose ``source``, ``stages`` and ``outputs`` are its first source's (placement is
    decided on them and carried over to every source, see ``cut_for``); ``names`` and ``parts`` are the
    sources in order (a batch's ``source`` key numbers them so), ``weights`` their normalised weights."""

    names: tuple[str, ...] = ()
    parts: tuple[PipelineSpec, ...] = ()
    weights: tuple[float, ...] = ()
    window: int = DEFAULT_WINDOW
    ends: MixEnd = MixEnd.SAMPLES
    samples: int | None = None
    kind: str = field(default="images")  # "images" or "tables"

    def cut_for(self, part: int, cut: int) -> int:
        """The cut of source ``part`` that the mix's ``cut`` (a cut of the first source's stages) stands for:
        all on the CPU stays so; otherwise the GPU from the same stage name where that source has it, else from
        the earliest stage it can."""
        spec = self.parts[part]
        if part == 0 or cut >= len(self.stages):
            return cut if part == 0 else spec.all_cpu
        name = self.stages[cut].name
        names = [s.name for s in spec.stages]
        if name in names and names.index(name) in spec.valid_cuts():
            return names.index(name)
        gpu = [c for c in spec.valid_cuts() if c < spec.all_cpu]
        return min(gpu) if gpu else spec.all_cpu

    def counts(self, weights: tuple[float, ...] | None = None) -> tuple[int, ...]:
        """Samples of each source in every window: the largest-remainder rounding of ``weight * window``."""
        return window_counts(self.weights if weights is None else weights, self.window)


def window_counts(weights, window: int) -> tuple[int, ...]:
    exact = [w * window for w in weights]
    counts = [math.floor(x) for x in exact]
    rest = window - sum(counts)
    by_remainder = sorted(range(len(exact)), key=lambda k: (-(exact[k] - counts[k]), k))
    for k in by_remainder[:rest]:
        counts[k] += 1
    return tuple(counts)


def normalised_weights(names: tuple[str, ...], weights: Mapping[str, float], window: int,
                       argument: str = "weights") -> tuple[float, ...]:
    """The weights in ``names`` order, divided by their sum; a ValueError names a missing, unknown, negative,
    zero or non-finite weight, or one too small to get a sample in a window."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"{argument} must be a dict of source name -> weight, got {type(weights).__name__}")
    missing = [n for n in names if n not in weights]
    unknown = [k for k in weights if k not in names]
    if missing or unknown:
        raise ValueError(f"{argument} must name exactly the sources {list(names)}; "
                         + (f"missing {missing}" if missing else "") + ("; " if missing and unknown else "")
                         + (f"unknown {unknown}" if unknown else ""))
    values = []
    for n in names:
        w = weights[n]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"{argument}[{n!r}] must be a positive finite number, got {w!r}")
        values.append(float(w))
    total = sum(values)
    normal = tuple(v / total for v in values)
    counts = window_counts(normal, window)
    empty = [n for n, c in zip(names, counts) if c == 0]
    if empty:
        raise ValueError(f"{argument}: source(s) {empty} would get no sample in a window of {window} (weight x "
                         f"window rounds to 0); give them more weight or mix with a larger window")
    return normal


def mix(sources: Mapping[str, PipelineSpec], weights: Mapping[str, float], *, window: int = DEFAULT_WINDOW,
        ends: MixEnd | str = MixEnd.SAMPLES, samples: int | None = None) -> MixSpec:
    """The pipeline that draws ``sources`` (name -> pipeline) at ``weights`` (name -> positive weight; divided
    by their sum). Over every window of ``window`` consecutive samples of an epoch (counted from the epoch's
    start or from a ``set_weights``), each source has ``round(weight * window)`` samples (largest remainder),
    so within one sample of its share; their places in the window are shuffled by the Loader's seed. ``ends``:
    see :class:`MixEnd`; ``samples`` is the epoch's length with ``ends="samples"`` (default: the sizes of the
    sources added up). Batches hold the sources' outputs, ``index`` (a sample's index in the mix: its index in
    its source plus the sizes of the sources before it), ``source`` (the source's number in ``names``) and
    ``valid``."""
    if not isinstance(sources, Mapping) or not sources:
        raise TypeError(f"sources must be a non-empty dict of name -> pipeline, got {sources!r}")
    names = tuple(sources)
    for n in names:
        if not isinstance(n, str) or not n:
            raise TypeError(f"sources: every name must be a non-empty string, got {n!r}")
        if not isinstance(sources[n], PipelineSpec) or isinstance(sources[n], MixSpec):
            raise TypeError(f"sources[{n!r}] must be a feedline pipeline (image.train(...), tabular(...), ...), "
                            f"not a mix, got {type(sources[n]).__name__}")
    window = positive_int("window", window)
    ends = parse_enum(MixEnd, "ends", ends)
    if samples is not None:
        samples = positive_int("samples", samples)
        if ends is not MixEnd.SAMPLES:
            raise ValueError(f"samples={samples} is the epoch's length with ends='samples', but ends={ends.value!r}")
    normal = normalised_weights(names, weights, window)
    parts = tuple(sources[n] for n in names)
    kind = _kind(names, parts)
    _check_same_outputs(names, parts, kind)
    on_error = {p.on_error for p in parts if p.on_error is not None}
    if len(on_error) > 1:
        raise ValueError(f"sources: on_error differs between sources ({sorted(o.value for o in on_error)}); give one "
                         f"on_error to the Loader instead")
    files = {str(getattr(p.source, "on_error", None)) for p in parts}  # (a table's files carry their own)
    if len(files) > 1:
        raise ValueError(f"sources: the tables' files differ in on_error ({sorted(files)}); a mix's tables take one")
    first = parts[0]
    return MixSpec(f"mix({','.join(names)})", first.source, first.stages, first.outputs,
                   default_shuffle=first.default_shuffle, on_error=on_error.pop() if on_error else None,
                   names=names, parts=parts, weights=normal, window=window, ends=ends,
                   samples=samples, kind=kind)


def _kind(names, parts) -> str:
    kinds = []
    for n, p in zip(names, parts):
        if isinstance(p.source, ImageSource):
            kinds.append("images")
        elif isinstance(p.source, TabularFiles):
            kinds.append("tables")
        else:
            raise TypeError(f"sources[{n!r}]: a mix takes image or table pipelines, got a source of type "
                            f"{type(p.source).__name__}")
    for k in range(1, len(parts)):
        if kinds[k] != kinds[0]:
            raise ValueError(f"sources {names[0]!r} and {names[k]!r} cannot be mixed: {names[0]!r} gives "
                             f"{kinds[0]}, {names[k]!r} gives {kinds[k]}")
    return kinds[0]


def output_type(spec: PipelineSpec, kind: str) -> dict[str, object]:
    """What a pipeline's batches hold, as far as a mix needs them equal: the keys, and for images the last
    stage's type (dtype, layout, size, channels), for tables the schema's shape (dense columns, sparse keys)."""
    described: dict[str, object] = {"outputs": tuple(spec.outputs)}
    if kind == "images":
        from .image import infer_types
        t = infer_types(spec.stages[1:])[-1]
        described.update({"dtype": t.dtype.value, "layout": t.layout, "size": t.size, "channels": t.channels})
    else:
        from .features import AssembleSparse, DenseColumns
        dense = [s for s in spec.stages if isinstance(s, DenseColumns)]
        sparse = [s for s in spec.stages if isinstance(s, AssembleSparse)]
        described["dense columns"] = tuple(d.name for d in dense[0].dense) if dense else ()
        described["sparse keys"] = tuple(sparse[0].keys) if sparse else ()
        described["multi-hot"] = bool(sparse) and not sparse[0].fixed
    return described


def _check_same_outputs(names, parts, kind: str) -> None:
    first = output_type(parts[0], kind)
    for k in range(1, len(parts)):
        other = output_type(parts[k], kind)
        differ = [f"{key}: {first[key]!r} vs {other.get(key)!r}" for key in first if first[key] != other.get(key)]
        if differ:
            raise ValueError(f"sources {names[0]!r} and {names[k]!r} give outputs of different types, so their "
                             f"samples cannot share a batch ({names[0]!r} vs {names[k]!r}): " + "; ".join(differ))
