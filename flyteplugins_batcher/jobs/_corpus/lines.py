"""A corpus as a table: our sample, a JSONL file of documents, or a text file's lines as `id` and `text` columns."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from flyteplugins_batcher.jobs._table.source import TableSource, open_table

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "data" / "embed_sample.jsonl"
_LINES = pa.schema([("id", pa.string()), ("text", pa.string())])


def corpus_table(corpus: str) -> TableSource:
    """The corpus as a table: our sample, a JSONL file, or a text file's lines (`id`, `text`), local or remote.

    Raises:
        FileNotFoundError: A local path that names no file.
    """
    path = str(SAMPLE_CORPUS) if corpus == "sample" else corpus
    if "://" not in path:
        path = str(Path(path).expanduser())
        if not Path(path).is_file():
            raise FileNotFoundError(f"corpus {corpus!r} is not 'sample', an existing file, or a URI")
    if path.endswith(".txt"):
        return TableSource(corpus, _LINES, None, lambda rows: _lines(path, rows))
    return replace(open_table(path), description=corpus)


def _lines(path: str, rows: int) -> Iterator[pa.RecordBatch]:
    """A text file's lines as record batches of `id` (the line's number, from 1) and `text`."""
    import flyte.storage

    ids: list[str] = []
    texts: list[str] = []
    filesystem = flyte.storage.get_underlying_filesystem(path=path)  # this machine's, or an object store's
    with filesystem.open(path, "r", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            ids.append(str(number))
            texts.append(line.rstrip("\n"))
            if len(ids) == rows:
                yield pa.record_batch([ids, texts], schema=_LINES)
                ids, texts = [], []
    if ids:
        yield pa.record_batch([ids, texts], schema=_LINES)
