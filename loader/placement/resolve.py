"""Turning a placement request into a cut: ``"cpu"``, ``"gpu"``, ``"auto"`` or a per-stage mapping."""
from __future__ import annotations

from collections.abc import Mapping

from ...pipelines.spec import PipelineSpec
from ..errors import PlacementError

NAMED = ("cpu", "gpu", "auto")


def uses_gpu(spec: PipelineSpec, cut: int) -> bool:
    """Whether ``cut`` runs any stage of ``spec`` on the GPU (every cut but ``spec.all_cpu``)."""
    return cut < spec.all_cpu


def resolve(spec: PipelineSpec, placement: str | Mapping, gpu_available: bool) -> int:
    """The cut for ``placement``. ``"auto"`` here is the static rule (the earliest GPU cut where a GPU exists,
    else the CPU); the placement controller hands ``"auto"`` to the scheduler."""
    if isinstance(placement, Mapping):
        cut = spec.cut_from_mapping(placement)
        if uses_gpu(spec, cut) and not gpu_available:
            raise PlacementError(f"placement {dict(placement)} puts {[s.name for s in spec.stages[cut:]]} on the GPU, "
                                 f"but this machine has no usable CUDA GPU; use placement='cpu' or 'auto'")
        return cut
    if not isinstance(placement, str):
        raise TypeError(f"placement must be one of {NAMED} or a mapping of stage name to 'cpu'/'gpu', "
                        f"got {type(placement).__name__}")
    if placement == "cpu":
        return spec.all_cpu
    if placement == "gpu":
        if not gpu_available:
            raise PlacementError("placement='gpu' needs a CUDA GPU, and this machine has none usable "
                                 "(torch.cuda.is_available() is False); use placement='cpu' or 'auto'")
        return min(spec.valid_cuts())
    if placement == "auto":
        return min(spec.valid_cuts()) if gpu_available else spec.all_cpu
    raise ValueError(f"placement must be one of {NAMED} or a mapping of stage name to 'cpu'/'gpu', got {placement!r}")
