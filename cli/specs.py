"""The pipelines that bench and plan take by name, and the spec each name builds."""
from __future__ import annotations

IMAGE_PIPELINES = ("image-train", "image-val")
PIPELINES = IMAGE_PIPELINES + ("criteo",)


def pipeline_spec(pipeline: str, data: str, output: str = "float"):
    if pipeline == "criteo":
        from ..pipelines.criteo import criteo
        return criteo(data)
    from ..pipelines import image
    return (image.train if pipeline == "image-train" else image.val)(data, output=output)
