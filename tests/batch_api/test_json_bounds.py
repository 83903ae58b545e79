"""`loads_bounded`: JSON decoded within the bounds a request needs, each refusal naming its bound."""

from __future__ import annotations

import json

import pytest

from flyteplugins_batcher.batch_api import JSONBoundsError, RequestLineError, loads_bounded, parse_request_line
from flyteplugins_batcher.batch_api._json import MAX_DEPTH


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, f"nested deeper than {MAX_DEPTH} levels"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH} levels"),
        ('{"a": ' + '{"b": ' * 40 + "[" * 30 + "]" * 30 + "}" * 40 + "}", f"deeper than {MAX_DEPTH}"),
        ("9" * 5000, "an integer has 5000 digits"),
        ("-" + "1" * 101, "an integer has 101 digits"),
        ("1" + "0" * 120 + ".5", "a number is 123 characters long"),
        ("1e999", "the number 1e999 is out of range"),
        ('{"t": NaN}', "NaN is not a JSON value"),
        ("[Infinity]", "Infinity is not a JSON value"),
        ('"\\ud800"', "lone UTF-16 surrogate"),
        ('["a", "\\udc00b"]', "lone UTF-16 surrogate"),
        (b'{"a": "\xff"}', "not valid UTF-8 (byte 7"),
        ("", "not valid JSON: Expecting value at column 1"),
        ('{"a": 1,\n "b": }', "at line 2 column 7"),
    ],
)
def test_what_no_request_needs_is_refused_naming_the_bound(document: str | bytes, says: str) -> None:
    with pytest.raises(JSONBoundsError) as refused:
        loads_bounded(document)
    assert says in str(refused.value)


def test_what_requests_hold_is_read_as_json_reads_it() -> None:
    documents = [
        "[" * MAX_DEPTH + "]" * MAX_DEPTH,
        '{"s": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"\\\\"}',
        '"\\ud83d\\ude00 \\\\ud800"',  # a surrogate pair is one character; an escaped backslash is no escape
        "-" + "9" * 100,
        '{"seed": 18446744073709551616, "t": 0.7, "x": [1e308, -0.0]}',
        '{"a": null, "b": [true, false], "c": "\\u00e9"}',
    ]

    assert [loads_bounded(document) for document in documents] == [json.loads(document) for document in documents]


def test_a_batch_line_outside_the_bounds_fails_alone_as_invalid_json() -> None:
    with pytest.raises(RequestLineError) as deep:
        parse_request_line('{"prompt": ' + "[" * 5000 + "]" * 5000 + "}", 3)
    with pytest.raises(RequestLineError) as digits:
        parse_request_line('{"prompt": "x", "seed": ' + "9" * 5000 + "}", 4)

    assert (deep.value.code, deep.value.line) == ("invalid_json", 3) and "deeper than" in deep.value.message
    assert digits.value.code == "invalid_json" and "5000 digits" in digits.value.message
