"""Files: uploads (`purpose="batch"`) and the batches' output files, on disk under the data folder.

A file's bytes are written to a temporary name, flushed to disk and renamed into place, and only
then is its row committed: a crash mid-upload leaves no file that claims to be whole. At start,
leftovers of such a crash (temporary files, files without a row) are removed: all of them when the
server is alone, those untouched for minutes when other servers share the folder.

An upload reaches `save_upload` already bounded: `_limits.BodyLimit` stops reading the request at
`max_upload_mb` (so the multipart parser's spool file holds no more), and the copy counts again.
A file whose bytes are gone from the folder is a 404 that names the file, never its path.
"""

from __future__ import annotations

import codecs
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from flyteplugins_batcher.batch_api import JSONBoundsError, loads_bounded
from flyteplugins_batcher.server._errors import APIError
from flyteplugins_batcher.server._store import Store

UPLOAD_PURPOSES = ("batch",)
"""What `/v1/files` takes uploads for; `batch_output` files are made by the server itself."""

_COPY_CHUNK = 1 << 20
_ID_LIKE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def shown(identifier: str) -> str:
    """An id as a message may repeat it: `: <id>` when it looks like one, else nothing (no path is echoed back)."""
    return f": {identifier}" if _ID_LIKE.fullmatch(identifier) else ""


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: `file-...`, `batch_...`."""
    return f"{prefix}{secrets.token_hex(12)}"


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
    """Files on disk (`<data>/files/<id>`) and their rows in the store.

    Args:
        folder: Where the files live.
        store: Where their rows live.
        max_bytes: The largest upload taken.
    """

    def __init__(self, folder: Path, store: Store, *, max_bytes: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.store = store
        self.max_bytes = max_bytes

    def path(self, file_id: str) -> Path:
        return self.folder / file_id

    def save_upload(self, source: IO[bytes], *, filename: str, purpose: str) -> dict[str, Any]:
        """Keep an upload (blocking: call it in a thread); returns its row.

        Raises:
            APIError: 400 for a purpose other than `batch` or a file that is not JSONL; 413 over the size limit.
        """
        if purpose not in UPLOAD_PURPOSES:
            raise APIError(400, f"purpose must be one of {list(UPLOAD_PURPOSES)}, got {purpose!r}", param="purpose")
        file_id = new_id("file-")
        size = self._write(file_id, _limited(source, self.max_bytes))
        check_jsonl(self.path(file_id), on_failure=lambda: self.path(file_id).unlink(missing_ok=True))
        row = {"id": file_id, "filename": filename, "purpose": purpose, "bytes": size, "created_at": int(time.time())}
        self.store.insert_file(row)
        return row

    def write_output(self, lines: Iterable[str], *, filename: str) -> dict[str, Any]:
        """Write a batch output file (blocking); returns its row, which the caller commits with its batch."""
        file_id = new_id("file-")
        size = self._write(file_id, (f"{line}\n".encode() for line in lines))
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
            APIError: 404 when there is no such file (naming `param`, the field that gave its id).
        """
        row = self.store.file(file_id)
        if row is None:
            raise APIError(404, f"No such File object{shown(file_id)}", code="file_not_found", param=param)
        return row

    def content(self, file_id: str, *, param: str = "file_id") -> Path:
        """Where a file's bytes are, once it is known to have them.

        Raises:
            APIError: 404 when there is no such file, or its bytes are gone from the data folder
                (the message names the file, never where it was).
        """
        self.get(file_id, param=param)
        path = self.path(file_id)
        if not path.is_file():
            message = f"The content of file {file_id} is missing on the server."
            raise APIError(404, message, code="file_not_found", param=param)
        return path

    def delete(self, file_id: str) -> None:
        """Delete a file (its row first: a crash in between leaves an orphan that the next start removes)."""
        self.get(file_id)
        self.store.delete_file(file_id)
        self.path(file_id).unlink(missing_ok=True)

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
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".upload-")
        size = 0
        try:
            with os.fdopen(handle, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path(file_id))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _sync_folder(self.folder)
        return size


def _limited(source: IO[bytes], max_bytes: int) -> Iterable[bytes]:
    read = 0
    while chunk := source.read(_COPY_CHUNK):
        read += len(chunk)
        if read > max_bytes:
            message = f"The file is larger than the limit of {max_bytes // 2**20} MiB."
            raise APIError(413, message, code="file_too_large")
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
    raise APIError(
        400,
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
