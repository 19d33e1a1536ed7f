"""Where every stage of an image pipeline runs for one placement, and the DALI graph that follows from it.

Pure apart from ``define`` (which builds DALI nodes but nothing else), so every placement can be checked on a
machine where DALI cannot build a GPU pipeline. The rules, for a pipeline ``read, decode, s1, s2, ...``:

- ``read`` runs on the host: it reads each file and its header and draws every stage's parameters.
- DALI decodes, on the CPU or (``mixed``) on the GPU.
- A stage after decode runs in DALI on the GPU while it is placed on the GPU, has a DALI implementation,
  and every stage between it and the decoder ran in DALI too.
- Every other stage runs as torch ops on its backend's device: on the CPU image by image while sizes may
  differ or until a stage needs a whole batch, on the GPU on whole batches once images have one size. On the
  CPU, torch's antialiased uint8 resize is several times faster than DALI's, and an image is finished while
  it is still in cache.
So data leaves DALI once, crosses to the GPU once, and never comes back.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...pipelines.imaging.base import ImageStage
from ...pipelines.imaging.types import ImageType
from ...pipelines.spec import PipelineSpec
from ...pipelines.stage import Backend

HOST = "host"
DALI_CPU, DALI_MIXED, DALI_GPU = "dali:cpu", "dali:mixed", "dali:gpu"
TORCH_CPU, TORCH_CUDA = "torch:cpu", "torch:cuda"


@dataclass(frozen=True)
class TorchStep:
    """A stage run as torch ops: ``k`` its position among the image stages, ``gpu`` whether on the GPU, and
    ``batched`` whether on a whole batch (else image by image)."""

    k: int
    stage: ImageStage
    gpu: bool
    batched: bool


@dataclass(frozen=True)
class ImageGraph:
    spec: PipelineSpec
    cut: int
    stages: tuple[ImageStage, ...]   # the image stages: decode first (spec.stages without ``read``)
    types: tuple[ImageType, ...]     # what each image stage outputs
    engines: dict[str, str]          # stage name -> one of the engines above
    in_dali: int                     # how many image stages DALI runs (decode and those after it on the GPU)
    torch_steps: tuple[TorchStep, ...]
    decoded: bool = False            # DALI is fed decoded images (``Decode.dali_decoded``), not encoded files

    @property
    def dali_on_gpu(self) -> bool:
        return self.engines[self.stages[0].name] == DALI_MIXED or self.in_dali > 1

    @property
    def output(self) -> ImageType:
        return self.types[-1]


def assign_engines(spec: PipelineSpec, cut: int, types: list[ImageType], decoded: bool = False) -> ImageGraph:
    """The engines of ``spec`` placed at ``cut`` (``types``: each image stage's output, from ``infer_types``);
    ``decoded``: DALI's input is the decoded images (HWC uint8) instead of the encoded files."""
    backends = spec.backends_at(cut)
    read, *stages = spec.stages
    on_gpu = [backends[s.name] is Backend.GPU for s in stages]
    engines = {read.name: HOST, stages[0].name: DALI_MIXED if on_gpu[0] else DALI_CPU}
    in_dali = 1
    while in_dali < len(stages) and on_gpu[in_dali] and stages[in_dali].has_dali:
        engines[stages[in_dali].name] = DALI_GPU
        in_dali += 1
    steps: list[TorchStep] = []
    batched_cpu = False
    for k in range(in_dali, len(stages)):
        stage = stages[k]
        engines[stage.name] = TORCH_CUDA if on_gpu[k] else TORCH_CPU
        if on_gpu[k]:
            batched = types[k - 1].size is not None
        else:
            batched_cpu = batched_cpu or stage.needs_batch
            batched = batched_cpu
        steps.append(TorchStep(k, stage, on_gpu[k], batched))
    return ImageGraph(spec, cut, tuple(stages), tuple(types), engines, in_dali, tuple(steps), decoded)


def feed_names(graph: ImageGraph, params: list[dict]) -> dict[str, tuple[str, int]]:
    """The external inputs DALI reads per batch, name -> (DALI type name, ndim), taken from one batch's
    parameters (their kinds never change between batches)."""
    names = {"encoded": ("UINT8", 3 if graph.decoded else 1)}
    for k in range(graph.in_dali):
        for name, (_, dtype, ndim) in graph.stages[k].dali_feeds(params[k]).items():
            names[f"{k}.{name}"] = (dtype, ndim)
    return names


def feeds(graph: ImageGraph, encoded: list[np.ndarray], params: list[dict]) -> dict[str, object]:
    """One batch's values for ``feed_names``."""
    values: dict[str, object] = {"encoded": encoded}
    for k in range(graph.in_dali):
        for name, (value, _, _) in graph.stages[k].dali_feeds(params[k]).items():
            values[f"{k}.{name}"] = value
    return values


def define(graph: ImageGraph, names: dict[str, tuple[str, int]], source, fn=None, types=None):
    """The DALI graph, inside an active ``with pipeline:`` block; returns its output node. ``source`` is
    called once per batch and returns one value per name of ``names``, in order. ``fn``/``types`` default to
    DALI's modules (a test may pass recorders)."""
    if fn is None:
        from nvidia.dali import fn
    if types is None:
        from nvidia.dali import types
    nodes = fn.external_source(source=source, num_outputs=len(names), batch=True, device="cpu",
                               dtype=[getattr(types, t) for t, _ in names.values()],
                               ndim=[n for _, n in names.values()])
    fed = dict(zip(names, nodes))
    node = fed["encoded"]
    for k in range(graph.in_dali):
        stage = graph.stages[k]
        own = {name.split(".", 1)[1]: v for name, v in fed.items() if name.startswith(f"{k}.")}
        engine = graph.engines[stage.name]
        if engine == DALI_GPU and node.device == "cpu":
            node = node.gpu()
        device = "gpu" if engine in (DALI_MIXED, DALI_GPU) else "cpu"
        node = stage.dali_decoded(node, own, device) if graph.decoded and k == 0 else stage.dali(node, own, device)
    return node
