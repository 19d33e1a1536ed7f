"""The pipelines that bench, plan and profile take by name, the spec each name builds, and their defaults."""
from __future__ import annotations

IMAGE_PIPELINES = ("image-train", "image-val")
PIPELINES = IMAGE_PIPELINES + ("criteo",)


def pipeline_spec(pipeline: str, data: str, output: str = "float"):
    if pipeline == "criteo":
        from ..pipelines.criteo import criteo
        return criteo(data)
    from ..pipelines import image
    return (image.train if pipeline == "image-train" else image.val)(data, output=output)


def batch_size_of(pipeline: str, given: int | None) -> int:
    """``--batch-size`` as given, else the pipeline's default: 8192 rows of Criteo, 64 images."""
    return given or (8192 if pipeline == "criteo" else 64)


def device_for(placement: str) -> str:
    """Where the batches go: the GPU where there is one, unless ``--placement cpu``."""
    from ..loader.devices import gpu_available

    return "cuda" if placement != "cpu" and gpu_available() else "cpu"
