"""A batch file's lines: request lines read, repeated ids spotted, result and error lines written.

Request lines are read from bytes: a BOM on the first line is accepted, invalid UTF-8 fails its line
alone. `SeenIds` spots a repeated `custom_id` over millions of lines without holding them in memory.
The output lines are in the OpenAI Batch API's shape, a result or an error keyed by `custom_id`;
what goes inside a result line (a chat completion, embeddings) is `_responses`' business.
"""

from __future__ import annotations

import codecs
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from flyteplugins_batcher.batch_api._json import JSONBoundsError, loads_bounded
from flyteplugins_batcher.batch_api._line_errors import RequestLineError

RequestLine = tuple[int, str | RequestLineError]
"""A line's 1-based number, and its text, or the error that fails it (`invalid_json` for bytes that are not UTF-8)."""


def read_request_lines(lines: Iterable[bytes]) -> Iterator[RequestLine]:
    """The request lines of a JSONL file opened in binary mode, decoded one by one.

    Each line is decoded as UTF-8 on its own, so bytes that are not UTF-8 fail only their line,
    as `invalid_json` naming the byte offset, instead of being replaced silently (which would run
    the request on a mangled prompt). A UTF-8 byte-order mark at the start of the file (written by
    spreadsheet tools and Windows editors) is dropped. Blank lines are skipped, but counted, so
    line numbers match the file's.

    Args:
        lines: The file's lines as bytes, for example an `open(path, "rb")` file object.

    Yields:
        `(line_number, text)` for each non-blank line, with its line ending removed, or
        `(line_number, RequestLineError)` for a line that is not valid UTF-8.

    Example:
        ```python
        with open("requests.jsonl", "rb") as file:
            for number, text in read_request_lines(file):
                if isinstance(text, RequestLineError):
                    errors.write(json.dumps(error_line(text, request_number=number)) + "\\n")
                    continue
                request = parse_request_line(text, number)
        ```
    """
    for number, raw in enumerate(lines, start=1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        raw = raw.rstrip(b"\r\n")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            yield number, _encoding_error(error, number)
            continue
        if text.strip():
            yield number, text


def _encoding_error(error: UnicodeDecodeError, number: int) -> RequestLineError:
    bad = error.object[error.start : error.end].hex(" ")
    return RequestLineError(
        "invalid_json",
        f"the line is not valid UTF-8: {error.reason} (byte {bad}) at byte offset {error.start} of the line; "
        "save the file as UTF-8",
        line=number,
        custom_id=_readable_custom_id(error.object),
    )


def _readable_custom_id(raw: bytes) -> str | None:
    """The line's `custom_id` when the rest of it parses (decoded with replacement), so its error line can carry it.

    An id that itself holds the bad bytes is not the id the user wrote, so it is not given.
    """
    try:
        data = loads_bounded(raw.decode("utf-8", errors="replace"))
    except JSONBoundsError:
        return None
    custom_id = data.get("custom_id") if isinstance(data, dict) else None
    if not isinstance(custom_id, str) or not custom_id or "\ufffd" in custom_id:
        return None
    return custom_id


class SeenIds:
    """The ids seen so far, in an on-disk SQLite table (memory stays flat however long the file).

    Args:
        directory: Where the table's file goes (a temporary directory by default).

    Example:
        ```python
        with SeenIds() as seen:
            first_line = seen.add("request-7", line=12)  # None: new; else the line it was first on
        ```
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self._directory = tempfile.TemporaryDirectory(dir=directory, prefix="custom-ids-")
        self._db = sqlite3.connect(Path(self._directory.name) / "ids.sqlite", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE ids (id TEXT PRIMARY KEY, line INTEGER) WITHOUT ROWID")
        self._db.execute("BEGIN")

    def add(self, custom_id: str, line: int) -> int | None:
        """Record `custom_id`; returns `None` if it is new, else the line it was first seen on."""
        inserted = self._db.execute("INSERT OR IGNORE INTO ids VALUES (?, ?)", (custom_id, line)).rowcount
        if inserted:
            return None
        return int(self._db.execute("SELECT line FROM ids WHERE id = ?", (custom_id,)).fetchone()[0])

    def close(self) -> None:
        """Drop the table and its file."""
        self._db.close()
        self._directory.cleanup()

    def __enter__(self) -> SeenIds:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def output_line(custom_id: str, request_number: int, body: dict[str, Any]) -> dict[str, Any]:
    """A batch output line around a response body (`response.status_code` 200, no error)."""
    request_id = f"req_{request_number}"
    return {
        "id": f"batch_{request_id}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def line_id(line: int) -> str:
    """The `custom_id` of a line that gives none: a plain line's, and the error line of one that has no string id."""
    return f"line-{line}"


def error_line(error: RequestLineError, *, request_number: int) -> dict[str, Any]:
    """The errors-file line for a request that failed (`error.code`, `error.message`, and its input line).

    Its `custom_id` is always a string, as OpenAI's and vLLM's output types require: the line's own, or
    `line_id(line)` for a line without one (not JSON, no `custom_id`, or one that is not a string).
    """
    return {
        "id": f"batch_req_{request_number}",
        "custom_id": error.custom_id if error.custom_id is not None else line_id(error.line),
        "response": None,
        "error": {"code": error.code, "message": error.message, "line": error.line},
    }
