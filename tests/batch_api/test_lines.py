"""Reading request lines from bytes: a BOM is accepted, bytes that are not UTF-8 fail their line alone."""

from __future__ import annotations

import io
import json

from flyteplugins_batcher.batch_api import RequestLineError, parse_request_line, read_request_lines

LINE = json.dumps({"custom_id": "a", "prompt": "héllo"}).encode()


def read(data: bytes) -> list[tuple[int, str | RequestLineError]]:
    return list(read_request_lines(io.BytesIO(data)))


def test_a_bom_on_the_first_line_is_dropped_and_the_line_parses():
    [(number, text)] = read(b"\xef\xbb\xbf" + LINE + b"\n")
    assert number == 1 and isinstance(text, str) and not text.startswith("\ufeff")
    assert parse_request_line(text, number).custom_id == "a"


def test_parse_request_line_accepts_a_bom_on_line_one_read_as_text():
    assert parse_request_line("\ufeff" + LINE.decode(), 1).prompt == "héllo"


def test_invalid_utf8_fails_only_its_line_naming_the_encoding_and_the_byte_offset():
    broken = b'{"custom_id": "b", "prompt": "caf\xe9 au lait"}'  # Latin-1 é
    lines = read(LINE + b"\n" + broken + b"\n" + LINE + b"\r\n")
    assert [number for number, _ in lines] == [1, 2, 3]
    assert isinstance(lines[0][1], str) and isinstance(lines[2][1], str)
    error = lines[1][1]
    assert isinstance(error, RequestLineError)
    assert error.code == "invalid_json" and error.line == 2
    offset = broken.index(b"\xe9")
    assert "not valid UTF-8" in error.message and f"byte offset {offset} of the line" in error.message
    assert "(byte e9)" in error.message
    assert error.custom_id == "b"  # the rest of the line parses: its error line can be matched to the request


def test_an_invalid_utf8_line_keeps_no_custom_id_it_cannot_read():
    unreadable_id = b'{"custom_id": "caf\xe9", "prompt": "x"}'
    not_json = b'{"custom_id": "c", "prompt": "caf\xe9'
    errors = [error for _, error in read(unreadable_id + b"\n" + not_json + b"\n")]
    assert all(isinstance(error, RequestLineError) and error.code == "invalid_json" for error in errors)
    assert [error.custom_id for error in errors] == [None, None]  # type: ignore[union-attr]


def test_a_line_of_garbage_bytes_is_an_encoding_error_not_a_json_one():
    [(number, error)] = read(b"\xff\xfe\xfa\n")
    assert number == 1 and isinstance(error, RequestLineError)
    assert error.code == "invalid_json" and "byte offset 0" in error.message


def test_blank_lines_are_skipped_but_counted_and_line_endings_removed():
    lines = read(b"\n   \n" + LINE + b"\r\n\n" + LINE)
    assert [(number, text) for number, text in lines] == [(3, LINE.decode()), (5, LINE.decode())]


def test_a_bom_later_in_the_file_is_not_dropped():
    [(_, first), (_, second)] = read(LINE + b"\n\xef\xbb\xbf" + LINE)
    assert isinstance(second, str) and second.startswith("\ufeff") and not first.startswith("\ufeff")
