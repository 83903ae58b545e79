"""Files: uploads (`purpose="batch"`) and the batches' output files, on disk under the data folder.

A file's bytes are written to a temporary name, flushed to disk and renamed into place, and only
then is its row committed: a crash mid-upload leaves no file that claims to be whole. At start,
leftovers of such a crash (temporary files, files without a row) are removed: all of them when the
server is alone, those untouched for minutes when other servers share the folder.

With `files_uri` (an object-store prefix: `s3://bucket/batcher/files`, `gs://...`, or `file:///abs/path`
for a shared mount), every file is also put to `<files_uri>/<file id>` before its row is committed,
and that copy is the one of record: a replica that lacks a file in its own folder (another replica
made it) fetches it from there first, into a temporary name renamed into place. The object store is
reached through the filesystems flyte configures (`flyte.storage`), synchronously: these methods
block, and the server calls them in threads.

An upload reaches `save_upload` already bounded: `_limits.BodyLimit` stops reading the request at
`max_upload_mb` (so the multipart parser's spool file holds no more), and the copy counts again.
A file whose bytes are gone (from the folder, and from `files_uri` when there is one) is a 404 that
names the file, never its path or its URI.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from flyteplugins_batcher.batch_api import JSONBoundsError, loads_bounded
from flyteplugins_batcher.server._state.errors import NotFound, Refused, TooLarge
from flyteplugins_batcher.server._state.store import Store, new_id

if TYPE_CHECKING:
    import fsspec

UPLOAD_PURPOSES = ("batch",)
"""What `/v1/files` takes uploads for; `batch_output` files are made by the server itself."""

_COPY_CHUNK = 1 << 20
_ID_LIKE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def shown(identifier: str) -> str:
    """An id as a message may repeat it: `: <id>` when it looks like one, else nothing (no path is echoed back)."""
    return f": {identifier}" if _ID_LIKE.fullmatch(identifier) else ""


def file_object(row: dict[str, Any]) -> dict[str, Any]:
    """A file's row as the OpenAI API's `file` object."""
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "expires_at": row.get("expires_at"),
        "status_details": None,
    }


class FileStore:
    """Files on disk (`<data>/files/<id>`), in an object store too when given one, and their rows in the store.

    Args:
        folder: Where the files live on this machine.
        store: Where their rows live.
        max_bytes: The largest upload taken.
        files_uri: An object-store prefix that keeps every file too, the copy of record, which replicas
            with folders of their own share (`s3://bucket/batcher/files`, `file:///abs/path`). Empty:
            the folder alone.

    Raises:
        ValueError: `files_uri` is not a URI (`<scheme>://...`) of a filesystem fsspec knows.
    """

    def __init__(self, folder: Path, store: Store, *, max_bytes: int, files_uri: str = "") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.store = store
        self.max_bytes = max_bytes
        self.objects = ObjectFiles(files_uri) if files_uri else None

    def path(self, file_id: str) -> Path:
        """Where a file's bytes are in this machine's folder (they may not be there: see `local_path`)."""
        return self.folder / file_id

    def save_upload(self, source: IO[bytes], *, filename: str, purpose: str) -> dict[str, Any]:
        """Keep an upload (blocking: call it in a thread); returns its row.

        Raises:
            Refused: A purpose other than `batch`, or a file that is not JSONL.
            TooLarge: The file is over the size limit.
        """
        if purpose not in UPLOAD_PURPOSES:
            raise Refused(f"purpose must be one of {list(UPLOAD_PURPOSES)}, got {purpose!r}", param="purpose")
        file_id = new_id("file-")
        size = self._write(file_id, _limited(source, self.max_bytes))
        check_jsonl(self.path(file_id), on_failure=lambda: self.path(file_id).unlink(missing_ok=True))
        self._keep(file_id)
        row = {"id": file_id, "filename": filename, "purpose": purpose, "bytes": size, "created_at": int(time.time())}
        self.store.insert_file(row)
        return row

    def write_output(self, lines: Iterable[str], *, filename: str) -> dict[str, Any]:
        """Write a batch output file (blocking); returns its row, which the caller commits with its batch."""
        file_id = new_id("file-")
        size = self._write(file_id, (f"{line}\n".encode() for line in lines))
        self._keep(file_id)
        created = int(time.time())
        return {
            "id": file_id,
            "filename": filename,
            "purpose": "batch_output",
            "bytes": size,
            "created_at": created,
            "expires_at": None,
        }

    def get(self, file_id: str, *, param: str = "file_id") -> dict[str, Any]:
        """A file's row.

        Raises:
            NotFound: When there is no such file (naming `param`, the field that gave its id).
        """
        row = self.store.file(file_id)
        if row is None:
            raise NotFound(f"No such File object{shown(file_id)}", code="file_not_found", param=param)
        return row

    def content(self, file_id: str, *, param: str = "file_id") -> Path:
        """Where a file's bytes are on this machine, once it is known to have them (blocking with `files_uri`).

        Raises:
            NotFound: When there is no such file, or its bytes are gone from the data folder (and
                from `files_uri`): the message names the file, never where it was.
        """
        self.get(file_id, param=param)
        path = self.local_path(file_id)
        if path is None:
            message = f"The content of file {file_id} is missing on the server."
            raise NotFound(message, code="file_not_found", param=param)
        return path

    def local_path(self, file_id: str) -> Path | None:
        """A file's bytes in this machine's folder, fetched from `files_uri` first when they are not (blocking).

        Its row is not read: call it for an id the store gave. `None` when the bytes are nowhere.
        """
        path = self.path(file_id)
        if path.is_file() or self.objects is None:
            return path if path.is_file() else None
        try:
            with self.objects.open(file_id) as source:
                self._write(file_id, iter(lambda: source.read(_COPY_CHUNK), b""))
        except FileNotFoundError:
            return None
        return path

    def delete(self, file_id: str) -> None:
        """Delete a file (its row first: a crash in between leaves an orphan that the next start removes).

        With `files_uri`, its copy there goes too; a crash before that leaves it without a row.
        """
        self.get(file_id)
        self.store.delete_file(file_id)
        self.path(file_id).unlink(missing_ok=True)
        if self.objects is not None:
            self.objects.delete(file_id)

    def remove_leftovers(self, *, older_than_s: float = 0.0) -> int:
        """Remove temporary files and files without a row (a crash mid-write); returns how many.

        Args:
            older_than_s: Only those last written longer ago than this. 0 for a folder this server
                alone writes; minutes for one that other live servers share, whose uploads and output
                files in the making look just like a crash's leftovers.
        """
        known = self.store.file_ids()
        cutoff = time.time() - older_than_s
        leftovers = [path for path in self.folder.iterdir() if path.name not in known and _written(path) <= cutoff]
        for path in leftovers:
            path.unlink(missing_ok=True)
        return len(leftovers)

    def _write(self, file_id: str, chunks: Iterable[bytes]) -> int:
        """Write `chunks` to the file atomically: a temporary name, flushed to disk, then renamed."""
        return write_atomically(self.path(file_id), chunks)

    def _keep(self, file_id: str) -> None:
        """Put a file just written to `files_uri` (none: nothing to do); a failure removes it here too."""
        if self.objects is None:
            return
        try:
            self.objects.put(self.path(file_id), file_id)
        except BaseException:
            self.path(file_id).unlink(missing_ok=True)
            raise


class ObjectFiles:
    """The files' copies of record under an object-store prefix, `<uri>/<file id>`, through flyte's filesystems.

    `s3://`, `gs://` and `abfs://` get the filesystems `flyte.storage` configures for them (obstore's,
    with flyte's credentials and retries), used synchronously; `file://` is a folder (a shared mount,
    or a test's object store), written as the data folder is: a temporary name, flushed, renamed.

    Args:
        uri: The prefix: `s3://bucket/batcher/files`, `file:///abs/path`.

    Raises:
        ValueError: `uri` is not `<scheme>://...`, or fsspec knows no such filesystem.
    """

    def __init__(self, uri: str) -> None:
        if "://" not in uri:
            raise ValueError("files_uri must be an object-store prefix: s3://bucket/prefix, gs://..., file:///abs/path")
        self.uri = uri.rstrip("/")
        self.fs = _filesystem(self.uri)
        self.folder = Path(self.fs._strip_protocol(self.uri)) if _is_local(self.fs) else None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def put(self, path: Path, file_id: str) -> None:
        """Put a local file as `file_id` (blocking)."""
        if self.folder is not None:
            with path.open("rb") as source:
                write_atomically(self.folder / file_id, iter(lambda: source.read(_COPY_CHUNK), b""))
        else:
            self.fs.put_file(str(path), self._location(file_id))

    def open(self, file_id: str) -> IO[bytes]:
        """A file's bytes, read as they stream in.

        Raises:
            FileNotFoundError: There is no such file.
        """
        if self.folder is not None:
            return (self.folder / file_id).open("rb")
        location = self._location(file_id)
        size = self.fs.info(location)["size"]  # first: a file that fails to open half-made complains when collected
        return self.fs.open(location, "rb", size=size)

    def exists(self, file_id: str) -> bool:
        """Whether `file_id` is there."""
        return bool(self.fs.exists(self._location(file_id)))

    def delete(self, file_id: str) -> None:
        """Delete a file; one already gone is no error."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._location(file_id))

    def _location(self, file_id: str) -> str:
        return f"{self.uri}/{file_id}"


def _filesystem(uri: str) -> fsspec.AbstractFileSystem:
    """Flyte's filesystem for `uri`, synchronous (flyte registers obstore's as asynchronous ones)."""
    import flyte.storage  # only with a files_uri: importing it registers obstore's filesystems

    filesystem = flyte.storage.get_underlying_filesystem(path=uri)
    if getattr(filesystem, "asynchronous", False):
        filesystem = flyte.storage.get_underlying_filesystem(path=uri, asynchronous=False)
    return filesystem


def _is_local(filesystem: fsspec.AbstractFileSystem) -> bool:
    protocols = filesystem.protocol if isinstance(filesystem.protocol, tuple) else (filesystem.protocol,)
    return "file" in protocols


def write_atomically(path: Path, chunks: Iterable[bytes]) -> int:
    """Write `chunks` to `path` as a whole or not at all: a temporary name beside it, flushed, renamed; the size."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    size = 0
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)
    return size


def _limited(source: IO[bytes], max_bytes: int) -> Iterable[bytes]:
    read = 0
    while chunk := source.read(_COPY_CHUNK):
        read += len(chunk)
        if read > max_bytes:
            message = f"The file is larger than the limit of {max_bytes // 2**20} MiB."
            raise TooLarge(message, code="file_too_large")
        yield chunk


def check_jsonl(path: Path, *, on_failure: Any) -> None:
    """Refuse a file in which no line is a JSON object: not JSONL (a CSV, a JSON array, a binary file).

    A file with some bad lines is kept: those lines fail alone when a batch runs it.
    """
    with path.open("rb") as lines:
        for raw in lines:
            try:
                if isinstance(loads_bounded(raw.removeprefix(codecs.BOM_UTF8)), dict):
                    return
            except JSONBoundsError:
                continue
    on_failure()
    raise Refused(
        "Invalid file format for Batch API: no line is a JSON object. Upload JSONL, one request per line.",
        code="invalid_file_format",
        param="file",
    )


def _written(path: Path) -> float:
    """When a file was last written; a file gone meanwhile (another server removed it) is never a leftover."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def _sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (best effort: not every platform can open a folder)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
