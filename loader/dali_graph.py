"""The DALI graph of an image pipeline for one placement.

``node_devices`` is pure (no DALI import): it says on which DALI device every stage runs, so placements are
testable on machines where DALI cannot build a GPU pipeline. ``define`` emits the same graph for every
placement, changing only device arguments and the one CPU-to-GPU transfer.
"""
from __future__ import annotations

from ..pipelines.image import ImageOutput
from ..pipelines.spec import PipelineSpec
from ..pipelines.stage import Backend

HOST = "host"  # computed in Python by the runner before the batch enters DALI
HOST_STAGES = frozenset({"crop_window", "geometry"})
# The external inputs each pipeline's graph reads, fed per batch by the runner: name -> (DALI type, ndim).
INPUTS = {
    "image-train": {"encoded": ("UINT8", 1), "anchor": ("INT32", 1), "shape": ("INT32", 1), "flip": ("INT32", 0)},
    "image-val": {"encoded": ("UINT8", 1), "resize_w": ("FLOAT", 0), "resize_h": ("FLOAT", 0),
                  "crop_anchor": ("INT32", 1)},
}


def node_devices(spec: PipelineSpec, cut: int) -> dict[str, str]:
    backends = spec.backends_at(cut)
    devices = {}
    for stage in spec.stages:
        if stage.name in HOST_STAGES:
            devices[stage.name] = HOST
        elif backends[stage.name] is Backend.CPU:
            devices[stage.name] = "cpu"
        else:
            devices[stage.name] = "mixed" if stage.name == "decode" else "gpu"
    return devices


def define(spec: PipelineSpec, cut: int, source):
    """Build the graph inside an active ``with pipeline:`` block; returns the output node. ``source`` is
    called once per batch and returns one value per name in ``INPUTS[spec.name]``, in that order."""
    from nvidia.dali import fn, types

    devices = node_devices(spec, cut)
    names = list(INPUTS[spec.name])
    nodes = fn.external_source(source=source, num_outputs=len(names), batch=True, device="cpu",
                               dtype=[getattr(types, t) for t, _ in INPUTS[spec.name].values()],
                               ndim=[n for _, n in INPUTS[spec.name].values()])
    inputs = dict(zip(names, nodes))

    def on(stage: str, node):
        return node.gpu() if devices[stage] == "gpu" and node.device == "cpu" else node

    params = {s.name: s.params for s in spec.stages}
    if spec.name == "image-train":
        image = fn.decoders.image_slice(inputs["encoded"], inputs["anchor"], inputs["shape"],
                                        device=devices["decode"], output_type=types.RGB, axis_names="WH")
        width, height = params["resize"]["size"]
        image = fn.resize(on("resize", image), device=devices["resize"], resize_x=width, resize_y=height,
                          interp_type=types.INTERP_LINEAR, antialias=True)
        return _finish(on("normalize", image), devices["normalize"], params["normalize"], inputs["flip"])
    if spec.name == "image-val":
        image = fn.decoders.image(inputs["encoded"], device=devices["decode"], output_type=types.RGB)
        image = fn.resize(on("resize", image), device=devices["resize"], resize_x=inputs["resize_w"],
                          resize_y=inputs["resize_h"], interp_type=types.INTERP_LINEAR, antialias=True)
        image = on("normalize", image)
        image = fn.slice(image, inputs["crop_anchor"], types.Constant(list(params["normalize"]["crop"])),
                         device=devices["normalize"], axis_names="WH")
        return _finish(image, devices["normalize"], params["normalize"], None)
    raise ValueError(f"no DALI graph for pipeline {spec.name!r}")


def _finish(image, device: str, params, flip):
    from nvidia.dali import fn, types

    if params["output"] is ImageOutput.UINT8_NHWC:
        return image if flip is None else fn.flip(image, device=device, horizontal=flip)
    return fn.crop_mirror_normalize(image, device=device, mirror=0 if flip is None else flip,
                                    mean=[255.0 * m for m in params["mean"]], std=[255.0 * s for s in params["std"]],
                                    dtype=types.FLOAT, output_layout="CHW")
