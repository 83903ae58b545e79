"""Reading request lines from bytes: a BOM on the first line is accepted, invalid UTF-8 fails its line alone."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

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
