"""Opening a pipeline's source: what the declaration names becomes something that reads samples by index."""
from __future__ import annotations

from ...pipelines.image_sources import FileList, ImageFolder
from ...pipelines.tabular import FileFormat, TabularFiles
from .image_files import ImageFiles, open_folder, open_list
from .tabular import TabularReader


def open_source(declared) -> ImageFiles | TabularReader:
    """The opened source of a pipeline (``spec.source``): image files listed once, or tabular files read and
    validated once. A Loader opens its source once and shares it with every runner it builds."""
    if isinstance(declared, ImageFolder):
        return open_folder(declared)
    if isinstance(declared, FileList):
        return open_list(declared)
    if isinstance(declared, TabularFiles):
        if declared.format is FileFormat.TSV:
            from .tsv import TsvSource
            return TsvSource(declared)
        from .parquet import ParquetSource
        return ParquetSource(declared)
    raise TypeError(f"a pipeline's source must be an image folder, a file list or tabular files, "
                    f"got {type(declared).__name__}")


__all__ = ["open_source", "ImageFiles", "TabularReader"]
