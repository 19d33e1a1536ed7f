"""Where every stage of an image pipeline runs for one placement, and the DALI graph that follows from it.

``engines`` is pure (no DALI import), so placements are testable on machines where DALI cannot build a GPU
pipeline. DALI always decodes (``cpu`` or ``mixed``). Resize and normalize run in DALI on the GPU; on the
CPU they run as torch ops (``image_torch_ops``), whose uint8 resize is several times faster than DALI's CPU
resize. A normalize stage on the GPU after a CPU resize runs as torch ops on the GPU.
"""
from __future__ import annotations

from ..pipelines.image import ImageOutput
from ..pipelines.spec import PipelineSpec
from ..pipelines.stage import Backend

HOST = "host"             # Python on the host, before the batch enters DALI
HOST_STAGES = frozenset({"crop_window", "geometry"})


def engines(spec: PipelineSpec, cut: int) -> dict[str, str]:
    """Stage name -> ``host``, ``dali:cpu``, ``dali:mixed``, ``dali:gpu``, ``torch:cpu`` or ``torch:cuda``."""
    backends = spec.backends_at(cut)
    resize_in_dali = backends["resize"] is Backend.GPU
    placed = {}
    for stage in spec.stages:
        on_gpu = backends[stage.name] is Backend.GPU
        if stage.name in HOST_STAGES:
            placed[stage.name] = HOST
        elif stage.name == "decode":
            placed[stage.name] = "dali:mixed" if on_gpu else "dali:cpu"
        elif resize_in_dali:
            placed[stage.name] = "dali:gpu"
        else:
            placed[stage.name] = "torch:cuda" if on_gpu else "torch:cpu"
    return placed


def inputs(spec: PipelineSpec, cut: int) -> dict[str, tuple[str, int]]:
    """The external inputs the graph reads per batch: name -> (DALI type name, ndim)."""
    tail_in_dali = engines(spec, cut)["resize"] == "dali:gpu"
    if spec.name == "image-train":
        names = {"encoded": ("UINT8", 1), "anchor": ("INT32", 1), "shape": ("INT32", 1)}
        return {**names, "flip": ("INT32", 0)} if tail_in_dali else names
    if spec.name == "image-val":
        names = {"encoded": ("UINT8", 1)}
        if tail_in_dali:
            names.update({"resize_w": ("FLOAT", 0), "resize_h": ("FLOAT", 0), "crop_anchor": ("INT32", 1)})
        return names
    raise ValueError(f"no DALI graph for pipeline {spec.name!r}")


def define(spec: PipelineSpec, cut: int, source):
    """Build the graph inside an active ``with pipeline:`` block; returns its one output node. ``source`` is
    called once per batch and returns one value per name in ``inputs(spec, cut)``, in that order."""
    from nvidia.dali import fn, types

    placed = engines(spec, cut)
    feeds = inputs(spec, cut)
    nodes = fn.external_source(source=source, num_outputs=len(feeds), batch=True, device="cpu",
                               dtype=[getattr(types, t) for t, _ in feeds.values()],
                               ndim=[n for _, n in feeds.values()])
    fed = dict(zip(feeds, nodes))
    decoder = placed["decode"].split(":")[1]
    if spec.name == "image-train":
        image = fn.decoders.image_slice(fed["encoded"], fed["anchor"], fed["shape"], device=decoder,
                                        output_type=types.RGB, axis_names="WH")
    else:
        image = fn.decoders.image(fed["encoded"], device=decoder, output_type=types.RGB)
    if placed["resize"] != "dali:gpu":
        return image  # uint8 HWC crops (train) or whole images (val); the tail runs as torch ops
    image = image.gpu() if image.device == "cpu" else image
    params = {s.name: s.params for s in spec.stages}
    if spec.name == "image-train":
        width, height = params["resize"]["size"]
        image = fn.resize(image, device="gpu", resize_x=width, resize_y=height,
                          interp_type=types.INTERP_LINEAR, antialias=True)
        flip = fed["flip"]
    else:
        image = fn.resize(image, device="gpu", resize_x=fed["resize_w"], resize_y=fed["resize_h"],
                          interp_type=types.INTERP_LINEAR, antialias=True)
        image = fn.slice(image, fed["crop_anchor"], types.Constant(list(params["normalize"]["crop"])),
                         device="gpu", axis_names="WH")
        flip = 0
    norm = params["normalize"]
    if norm["output"] is ImageOutput.UINT8_NHWC:
        return fn.flip(image, device="gpu", horizontal=flip)
    return fn.crop_mirror_normalize(image, device="gpu", mirror=flip, dtype=types.FLOAT, output_layout="CHW",
                                    mean=[255.0 * m for m in norm["mean"]], std=[255.0 * s for s in norm["std"]])
