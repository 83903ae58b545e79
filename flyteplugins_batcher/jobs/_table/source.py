"""A table job's input, opened as a stream of Arrow record batches in row order: the driver never holds it whole.

What a table can be:

- a Parquet, CSV or JSONL file, or a folder of them (the files in name order), on this machine or in
  an object store (`s3://`, `gs://`, `abfs://`, ..., through flyte's storage and fsspec): read with
  `pyarrow.dataset`, a batch at a time (Parquet by row groups);
- a Hugging Face dataset saved with `save_to_disk` (a folder; `PATH:SPLIT` picks a split of a saved
  `DatasetDict`), or named on the Hub as `NAME`, `NAME:SPLIT` or `NAME:CONFIG:SPLIT`
  (`openai/gsm8k:main:test`): read from its memory-mapped Arrow files, never materialized;
- a `flyte.io.DataFrame` (by its URI, or its value when it holds one), or a table in memory: a
  `pandas.DataFrame`, a `pyarrow.Table`, a `polars.DataFrame` or anything else that speaks Arrow.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from flyteplugins_batcher.jobs._hub import datasets_offline, hub_reachable

BatchReader = Callable[[int], Iterator[pa.RecordBatch]]
"""Reads a table from its start: record batches of at most the rows asked for, in row order."""

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".parq": "parquet", ".csv": "csv", ".jsonl": "json"}
_FORMATS |= {".json": "json", ".ndjson": "json"}
_NO_SUFFIX = "parquet"
"""A file without a suffix in a folder: what flyte writes a DataFrame as (`00000`)."""
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+){0,2}$")
_HUB_HELP = (
    "Where the Hub is reachable, save it with `datasets.load_dataset(...).save_to_disk(PATH)` or "
    "`.to_parquet(PATH)` and pass PATH"
)


@dataclass(frozen=True)
class TableSource:
    """An opened table: what it is, its columns, its size when known, and its rows as Arrow record batches.

    Attributes:
        description: What the table is, for messages and the report.
        schema: Its columns.
        num_rows: Its rows, when known without reading it (Parquet metadata, a Hugging Face dataset, memory).
        read: Reads it from the start, a record batch at a time.

    Example:
        ```python
        source = open_table("questions.parquet")
        for batch in source.batches(1024):
            ...
        ```
    """

    description: str
    schema: pa.Schema
    num_rows: int | None
    read: BatchReader

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        """The table's record batches, of at most `rows` rows each, in row order."""
        return self.read(rows)


def open_table(table: Any) -> TableSource:
    """Open a table to read it a batch at a time (see the module's notes for what a table can be).

    Raises:
        FileNotFoundError: A path that names nothing (and is no Hugging Face dataset's name).
        ValueError: A table that cannot be read: an unknown file format, an empty folder, a Hub dataset
            out of reach (offline, say), or a value that is no table.
    """
    from flyte.io import DataFrame

    if isinstance(table, (str, Path)):
        return _named(str(table))
    if isinstance(table, DataFrame):
        if table.val is not None:
            return open_table(table.val)
        if not table.uri:
            raise ValueError("the flyte.io.DataFrame holds neither a value nor a URI")
        # Its files tell their format (flyte's CLI says "parquet" of any file it wraps, a .jsonl's too).
        return _files(table.uri)
    if type(table).__module__.split(".")[0] == "datasets":
        return _hugging_face(table, "a Hugging Face dataset in memory")
    return in_memory(arrow_table(table), f"a {type(table).__name__} in memory")


def in_memory(table: pa.Table, description: str) -> TableSource:
    """A table already in memory, read a slice at a time."""
    return TableSource(description, table.schema, table.num_rows, lambda rows: iter(table.to_batches(rows)))


def arrow_table(value: Any) -> pa.Table:
    """An in-memory table as Arrow: pandas, pyarrow, polars (`to_arrow`), or anything with `__arrow_c_stream__`.

    Raises:
        ValueError: `value` is not a table.
    """
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    if type(value).__module__.split(".")[0] == "pandas":
        return pa.Table.from_pandas(value, preserve_index=False)
    if hasattr(value, "to_arrow"):
        return arrow_table(value.to_arrow())
    if hasattr(value, "__arrow_c_stream__"):
        return pa.table(value)
    raise ValueError(
        f"cannot read a {type(value).__name__} as a table: give a path, a flyte.io.DataFrame, a pandas or polars "
        "DataFrame, or a pyarrow Table"
    )


def _named(text: str) -> TableSource:
    """The table a path, URI or Hub name names."""
    local = Path(text.removeprefix("file://")).expanduser()
    if "://" in text and not text.startswith("file://"):
        return _files(text)
    if local.exists():
        return _files(str(local.resolve()))
    saved, _, split = text.rpartition(":")
    if saved and Path(saved).expanduser().is_dir():
        return _saved_dataset(str(Path(saved).expanduser()), split)
    if _HUB_NAME.match(text) and Path(text).suffix.lower() not in _FORMATS:  # a file's name is no dataset's
        return _hub(text)
    raise FileNotFoundError(f"input {text!r}: no file or folder at {local.resolve()}")


def _files(uri: str) -> TableSource:
    """A Parquet, CSV or JSONL file or folder (or a saved Hugging Face dataset), local or in an object store."""
    import pyarrow.dataset as ds

    filesystem, path = _filesystem(uri)
    fmt = _format_of(filesystem, path, uri)
    if fmt == "hf":
        return _saved_dataset(uri, "")
    dataset = ds.dataset(path, format=fmt, filesystem=filesystem)
    rows = dataset.count_rows() if fmt == "parquet" else None  # Parquet's metadata has it; others must be read

    def read(batch_rows: int) -> Iterator[pa.RecordBatch]:
        # Arrow reads ahead 16 batches of 4 files by default: a little is enough to keep the chunks coming.
        return dataset.to_batches(batch_size=batch_rows, batch_readahead=2, fragment_readahead=1)

    return TableSource(uri, dataset.schema, rows, read)


def _filesystem(uri: str) -> tuple[Any, str]:
    """The fsspec filesystem of a URI (None for a local path: Arrow's own), and the path within it."""
    if "://" not in uri or uri.startswith("file://"):
        return None, uri.removeprefix("file://")
    import flyte.storage

    filesystem = flyte.storage.get_underlying_filesystem(path=uri)
    return filesystem, filesystem._strip_protocol(uri)


def _format_of(filesystem: Any, path: str, uri: str) -> str:
    """ "parquet", "csv", "json" (by the files' suffixes), or "hf" for a folder saved by `datasets`.

    Raises:
        ValueError: A file or folder whose format cannot be told, or a folder mixing formats.
    """
    if filesystem is None:
        import fsspec

        filesystem = fsspec.filesystem("file")
    if not filesystem.isdir(path):
        return _suffix_format(path, uri)
    names = [name.rstrip("/").rsplit("/", 1)[-1] for name in filesystem.ls(path, detail=False)]
    if "state.json" in names or "dataset_dict.json" in names:
        return "hf"
    files = [name for name in filesystem.find(path) if not name.rsplit("/", 1)[-1].startswith((".", "_"))]
    if not files:
        raise ValueError(f"input {uri!r} is an empty folder")
    formats = {_suffix_format(name, uri) for name in files}
    if len(formats) > 1:
        raise ValueError(f"input {uri!r} mixes file formats ({', '.join(sorted(formats))}): give one kind of file")
    return formats.pop()


def _suffix_format(name: str, uri: str) -> str:
    suffix = Path(name).suffix.lower()
    if not suffix:
        return _NO_SUFFIX
    if suffix not in _FORMATS:
        raise ValueError(
            f"input {uri!r}: cannot read {Path(name).name!r} as a table; give .parquet, .csv or .jsonl files, or a "
            "folder of them"
        )
    return _FORMATS[suffix]


def _saved_dataset(path: str, split: str) -> TableSource:
    """A Hugging Face dataset saved with `save_to_disk` (a split of a saved `DatasetDict` when `split` names one)."""
    import datasets

    loaded = datasets.load_from_disk(path)
    if isinstance(loaded, datasets.DatasetDict):
        loaded = _split(loaded, split, f"{path}:SPLIT")
    return _hugging_face(loaded, f"the Hugging Face dataset saved at {path}" + (f" ({split})" if split else ""))


def _hub(name: str) -> TableSource:
    """A dataset on the Hugging Face Hub, named `NAME`, `NAME:SPLIT` or `NAME:CONFIG:SPLIT` (from the cache offline).

    Raises:
        ValueError: The Hub is out of reach and the dataset is not in the cache, or it has no such split.
    """
    import datasets

    repository, *rest = name.split(":")
    config, split = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0] if rest else None)
    if not datasets_offline() and not hub_reachable():  # else `datasets` retries for half a minute before it fails
        raise ValueError(
            f"input {name!r}: no file or folder here has that name, and the Hugging Face Hub, to load "
            f"{repository!r} from, is out of reach (offline?). {_HUB_HELP}; or, with the dataset in your Hugging "
            "Face cache, set HF_HUB_OFFLINE=1."
        )
    try:
        loaded = datasets.load_dataset(repository, config, split=split)
    except Exception as error:  # offline, not found, no such config: all end the run before any inference
        raise ValueError(
            f"input {name!r}: no file or folder here has that name, and {repository!r} cannot be loaded from the "
            f"Hugging Face Hub ({type(error).__name__}: {error}). {_HUB_HELP}."
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = _split(loaded, "", f"{repository}:SPLIT")
    return _hugging_face(loaded, f"the Hugging Face dataset {name}")


def _split(splits: Any, split: str, spelled: str) -> Any:
    if split:
        if split not in splits:
            raise ValueError(f"the dataset has no split {split!r} (it has {', '.join(splits)})")
        return splits[split]
    if len(splits) != 1:
        raise ValueError(f"the dataset holds the splits {', '.join(splits)}: name one, as {spelled}")
    return next(iter(splits.values()))


def _hugging_face(dataset: Any, description: str) -> TableSource:
    """A `datasets.Dataset`, read from its memory-mapped Arrow files a batch at a time."""

    def read(rows: int) -> Iterator[pa.RecordBatch]:
        for table in dataset.with_format("arrow").iter(batch_size=rows):
            yield from table.to_batches()

    return TableSource(description, dataset.features.arrow_schema, dataset.num_rows, read)
