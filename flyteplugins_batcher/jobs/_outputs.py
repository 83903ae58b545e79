"""Where a run's files go: the destination is checked before any inference, the files are published at the end.

A run writes its files as results arrive in a work folder of its own (`batch-jsonl-*`,
`batch-llm-*` or `embed-*` in the temp directory). At the end they are published, and the work
folder is removed, so that a run leaves one copy of its results, in one place:

- `--output_dir` a local folder, or a `file://` URI: the files are copied there.
- `--output_dir` a remote URI (`s3://`, `gs://`, `abfs://`, `abfss://`): Flyte uploads them there.
- no `--output_dir`: the run's own Flyte storage. On a cluster that is its blob storage; in a
  `--local` run, flyte's local raw-data folder of the run (`/tmp/flyte/raw_data/<run>/...`, beside
  its metadata and report in `/tmp/flyte/metadata/<run>/`).

The returned Flyte `File`s point at the published files. The work folder is removed only once every
file is published; if publishing fails, it is kept and the error names it: the results are never lost.
A JSONL file in the work folder is written line by line as results arrive (`JsonLines`).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

import flyte
from flyte.io import File

from flyteplugins_batcher import BatcherError

REMOTE_SCHEMES = ("s3", "gs", "abfs", "abfss")
"""URI schemes of the object stores Flyte writes to."""


class OutputDirError(BatcherError, ValueError):
    """`--output_dir` cannot receive the run's files; raised before any inference."""


class PublishError(BatcherError, RuntimeError):
    """Publishing a run's files failed at the end; they are still in the work folder, which the message names."""


@dataclass(frozen=True)
class Destination:
    """Where published files go: a local folder, a remote URI prefix, or (neither) the run's Flyte storage.

    Attributes:
        folder: A local folder, checked to be writable.
        uri: A remote prefix such as `s3://bucket/out` (written by Flyte; checked when written).

    Example:
        ```python
        destination = Destination.check("s3://bucket/out")  # at the start of the run
        ...
        results = await destination.publish(work / "results.jsonl")  # at the end
        ```
    """

    folder: Path | None = None
    uri: str | None = None

    @classmethod
    def check(cls, output_dir: str, names: Sequence[str] = ()) -> Destination:
        """The destination `output_dir` names, checked now: a local folder is created and must be writable.

        Args:
            output_dir: A local folder, a `file://` URI, a remote URI, or "" (the run's Flyte storage).
            names: The files that will be published there; none of them may be a folder.

        Raises:
            OutputDirError: An existing file, a folder that cannot be created or written, a target that
                is a folder, or a URI scheme Flyte cannot write to.
        """
        text = output_dir.strip()
        if not text:
            return cls()
        scheme, separator, rest = text.partition("://")
        if not separator:
            return cls(folder=_writable_folder(Path(text).expanduser(), output_dir, names))
        if scheme == "file":
            local = unquote(rest.removeprefix("localhost"))
            if not local:
                raise OutputDirError(f"output_dir {output_dir!r} names no folder (file:///abs/path or file://rel/path)")
            return cls(folder=_writable_folder(Path(local), output_dir, names))
        if scheme in REMOTE_SCHEMES and rest.strip("/"):
            return cls(uri=text.rstrip("/"))
        supported = ", ".join(f"{name}://" for name in ("file", *REMOTE_SCHEMES))
        raise OutputDirError(
            f"output_dir {output_dir!r}: cannot write to {scheme}:// (use a local folder, or a URI of {supported}, "
            "with a bucket)"
        )

    @classmethod
    def for_file(cls, output_file: str) -> tuple[Destination, str]:
        """The destination of one output file (`-o results.jsonl`, `s3://bucket/out/results.jsonl`), and its name.

        Raises:
            OutputDirError: As `check`, for the file's folder; or the path names no file.
        """
        text = output_file.strip()
        folder, _, name = text.rstrip("/").rpartition("/")
        if not name or name in (".", "..") or text.endswith("/"):
            raise OutputDirError(f"output_file {output_file!r} names no file")
        if "://" not in text:
            local = Path(text).expanduser()
            folder, name = str(local.parent), local.name
        elif not folder.partition("://")[2]:
            folder += "/"  # a file at the root of a bucket or of file://
        return cls.check(folder, (name,)), name

    def describe(self) -> str:
        """Where the files go, for messages."""
        return str(self.folder or self.uri or "the run's Flyte storage")

    async def publish(self, path: Path) -> File:
        """Publish one file of the work folder (copied, or uploaded); the `File` that names it there.

        Raises:
            OSError: The file could not be moved or uploaded.
        """
        if self.folder is not None:
            return await File.from_local(str(_copy(path, self.folder / path.name)))
        if self.uri is not None:
            return await File.from_local(str(path), f"{self.uri}/{path.name}")
        local_storage = _local_run_storage()
        if local_storage is not None:
            return await File.from_local(str(_copy(path, Path(local_storage.get_random_remote_path(path.name)))))
        return await File.from_local(str(path))  # uploaded to the run's storage (or kept where it is)


class WorkFolder:
    """The temporary folder a run writes its files in as results arrive; `publish` empties it into a `Destination`.

    Args:
        prefix: The folder's name prefix in the temp directory (`batch-jsonl-`, say).
        destination: Where the files go at the end (checked already).

    Example:
        ```python
        work = WorkFolder("batch-jsonl-", Destination.check(output_dir))
        results = JsonLines(work.path / "results.jsonl")
        ...
        [published] = await work.publish([results.path])
        ```
    """

    def __init__(self, prefix: str, destination: Destination) -> None:
        self.destination = destination
        self.path = Path(tempfile.mkdtemp(prefix=prefix))

    async def publish(self, paths: Sequence[Path]) -> list[File]:
        """Publish the files, then remove the work folder unless a published `File` still points into it.

        Raises:
            PublishError: Publishing failed; the work folder and every file in it are kept, and the message
                names it.
        """
        try:
            files = [await self.destination.publish(path) for path in paths]
        except Exception as error:
            raise PublishError(
                f"could not publish to {self.destination.describe()} ({error}); the files are in {self.path}"
            ) from error
        if not any(Path(file.path).is_relative_to(self.path) for file in files if "://" not in file.path):
            self.discard()
        return files

    def discard(self) -> None:
        """Remove the work folder and what it holds (a run that failed as a whole has nothing to publish)."""
        shutil.rmtree(self.path, ignore_errors=True)


def _writable_folder(folder: Path, given: str, names: Sequence[str]) -> Path:
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"output_dir {given!r}: {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise OutputDirError(f"output_dir {given!r}: cannot write to {folder}: {error.strerror or error}") from None
    clashes = [name for name in names if (folder / name).is_dir()]
    if clashes:
        raise OutputDirError(f"output_dir {given!r}: {folder / clashes[0]} is a folder; the run writes a file there")
    return folder.resolve()


def _copy(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def _local_run_storage() -> flyte.models.RawDataPath | None:
    """The run's raw-data storage when it is a local folder (a `--local` run), else `None`."""
    context = flyte.ctx()
    storage = context.raw_data_path if context is not None else None
    if storage is None or not storage.path or "://" in storage.path.removeprefix("file://"):
        return None
    return storage


class InputOrderFile:
    """One JSONL file of every line's output, in input order: `vllm run-batch`'s output file.

    Lines finish out of order (chunks run side by side, and placement regroups them), so each is kept
    in an on-disk SQLite table keyed by its line number, and the file is written in order once the run
    ends: memory stays flat however long the input.

    Args:
        path: The file to write (its folder is created).

    Example:
        ```python
        output = InputOrderFile(work / "results.jsonl")
        output.add(2, {"custom_id": "b"})
        output.add(1, {"custom_id": "a"})
        output.close()  # results.jsonl: a, then b
        ```
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.count = 0
        self._table = path.with_name(f".{path.name}.lines.sqlite")
        self._db = sqlite3.connect(self._table, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE lines (line INTEGER PRIMARY KEY, output TEXT) WITHOUT ROWID")
        self._db.execute("BEGIN")

    def add(self, line: int, output: dict[str, Any]) -> None:
        """Keep one input line's output (a line given twice keeps its last output)."""
        text = json.dumps(output, ensure_ascii=False)
        self._db.execute("INSERT OR REPLACE INTO lines VALUES (?, ?)", (line, text))
        self.count += 1

    def close(self) -> None:
        """Write the file, in input order, and drop the table (once: closing it again does nothing)."""
        if not self._table.exists():
            return
        with self.path.open("w", encoding="utf-8") as file:
            for (text,) in self._db.execute("SELECT output FROM lines ORDER BY line"):
                file.write(text + "\n")
        self._db.close()
        self._table.unlink(missing_ok=True)


class JsonLines:
    """A JSONL file written line by line as results arrive (nothing is kept in memory).

    Args:
        path: Where to write it (its folder is created).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.count = 0
        self._handle: IO[str] = path.open("w", encoding="utf-8")

    def write(self, line: dict[str, Any]) -> None:
        self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> None:
        self._handle.close()
