"""Decoding a request's JSON within bounds: nesting depth, number sizes, no NaN or Infinity, text that is text.

`json.loads` alone takes inputs a request has no use for and that cost the server dearly or fail
it later: a body nested 100,000 levels deep (`RecursionError`), an integer of 5,000 digits (Python
refuses to convert it, with a `ValueError` that names its internals), `NaN` and `Infinity` (not
JSON at all), a float that overflows to infinity, and a lone UTF-16 surrogate (`"\\ud800"`), which
is no character and fails whatever encodes it next. `loads_bounded` refuses each with a message
that names the problem, as a `JSONBoundsError` (a `ValueError`, so code that catches a bad JSON
document catches these too). Both the server's bodies and a batch file's lines are read with it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from flyteplugins_batcher import BatcherError

MAX_DEPTH = 64
"""Most levels of arrays and objects one document may nest (a chat request needs about 6)."""

MAX_INTEGER_DIGITS = 100
"""Most digits of an integer: far past any 64-bit value (19 digits), so that the field's own range check
names a value out of range, and far below the 4,300 digits at which Python refuses to convert one."""

MAX_NUMBER_CHARACTERS = 100
"""Most characters of a number with a fraction or exponent (a double needs at most 24)."""

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_QUOTED = re.compile(rb'"[^"]*"')
_NOT_A_BRACKET_OR_QUOTE = bytes(byte for byte in range(256) if byte not in b'[]{}"')
_AS_PARENTHESES = bytes.maketrans(b"[]{}", b"()()")


class JSONBoundsError(BatcherError, ValueError):
    """A JSON document that is not valid, or is outside the bounds a request may take; the message says which."""


def loads_bounded(document: str | bytes) -> Any:
    """The value of a JSON document, refusing what no request needs (see the module notes).

    Args:
        document: The JSON text, or its UTF-8 bytes.

    Raises:
        JSONBoundsError: Not UTF-8, not JSON, nested deeper than `MAX_DEPTH` levels, a number
            beyond `MAX_INTEGER_DIGITS` digits or out of a double's range, `NaN`/`Infinity`, or a
            lone surrogate; the message names the problem and where it is.
    """
    text = _text(document)
    try:
        value = json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    except RecursionError:  # the C decoder stops at the interpreter's recursion limit, far past MAX_DEPTH
        raise JSONBoundsError(f"the JSON is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as error:
        where = f"column {error.colno}" if error.lineno == 1 else f"line {error.lineno} column {error.colno}"
        raise JSONBoundsError(f"not valid JSON: {error.msg} at {where}") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and _nested_deeper_than(text, MAX_DEPTH):
        raise JSONBoundsError(f"the JSON is nested deeper than {MAX_DEPTH} levels")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise JSONBoundsError("a string holds a lone UTF-16 surrogate escape (\\ud800 to \\udfff), which is not text")
    return value


def _text(document: str | bytes) -> str:
    if isinstance(document, str):
        return document
    try:
        return document.decode("utf-8")
    except UnicodeDecodeError as error:
        raise JSONBoundsError(f"the body is not valid UTF-8 (byte {error.start} is not)") from None


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INTEGER_DIGITS:
        raise JSONBoundsError(f"an integer has {digits} digits; at most {MAX_INTEGER_DIGITS} are taken")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARACTERS:
        raise JSONBoundsError(f"a number is {len(text)} characters long; at most {MAX_NUMBER_CHARACTERS} are taken")
    value = float(text)
    if not math.isfinite(value):
        raise JSONBoundsError(f"the number {text[:32]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise JSONBoundsError(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def _nested_deeper_than(text: str, limit: int) -> bool:
    """Whether the arrays and objects of a valid JSON text nest deeper than `limit`, from its brackets alone.

    With the strings taken out, the brackets are the containers; each pass removes every innermost
    pair, so a text still holding brackets after `limit` passes nests deeper. All of it runs at C
    speed (a third of the parse's time): a walk of the parsed value in Python costs twice the parse.
    """
    unescaped = text.replace("\\\\", "").replace('\\"', "").encode()  # no quote is escaped now
    brackets = _QUOTED.sub(b"", unescaped.translate(_AS_PARENTHESES, _NOT_A_BRACKET_OR_QUOTE))
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"()", b"")
    return bool(brackets)


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string of `value` holds a lone surrogate (encoding it as UTF-8 fails), at C speed."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
