"""Opening a pipeline's source: what the declaration names becomes something that reads samples by index."""
from __future__ import annotations

from ...pipelines.image_sources import FileList, ImageFolder, ImageList, WebDataset
from ...pipelines.tabular import FileFormat, TabularFiles
from .image_files import ImageFiles, open_folder, open_image_list, open_list
from ..cache_policy import CacheSettings
from ..skip_log import SkipLog
from .chunked import ChunkedTable


def open_source(declared, *, cache_rows: int = 1 << 18, skips: SkipLog | None = None,
                cache: CacheSettings | None = None, lazy_index: bool = False) -> ImageFiles | ChunkedTable:
    """The opened source of a pipeline (``spec.source``): image files listed once, or tabular files indexed
    to be read chunk by chunk (``cache_rows``: parsed rows kept in memory at most). A Loader opens its source
    once and shares it with every runner it builds. A table lists its bad rows and files in ``skips`` (the
    Loader's log; default: one of its own). ``cache``: a text table's parsed chunks may be kept converted on
    disk (``table_cache``; None: never). ``lazy_index``: a single gzip text file may be indexed while it is
    read (``ChunkedTable``)."""
    if isinstance(declared, ImageFolder):
        return open_folder(declared)
    if isinstance(declared, FileList):
        return open_list(declared)
    if isinstance(declared, ImageList):
        return open_image_list(declared)
    if isinstance(declared, WebDataset):
        from .webdataset import open_webdataset
        return open_webdataset(declared)
    if isinstance(declared, TabularFiles):
        if declared.format in (FileFormat.TSV, FileFormat.CSV):
            from .table_cache import text_format
            return ChunkedTable(declared, text_format(declared, cache, cache_rows), cache_rows=cache_rows,
                                skips=skips, lazy_index=lazy_index)
        if declared.format is FileFormat.COLUMNAR:
            from .columnar import ColumnarFormat
            return ChunkedTable(declared, ColumnarFormat(declared.columns), cache_rows=cache_rows,
                                skips=skips)
        from .parquet import ParquetFormat
        return ChunkedTable(declared, ParquetFormat(declared.columns), cache_rows=cache_rows, skips=skips)
    raise TypeError(f"a pipeline's source must be an image folder, a file list, image paths, webdataset shards or "
                    f"tabular files, got {type(declared).__name__}")


__all__ = ["open_source", "ImageFiles", "ChunkedTable"]
