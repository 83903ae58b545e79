"""`FieldChecks`: one request's fields checked as the OpenAI API checks them, failing its line with the field named
as the request wrote it (`body.top_p`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flyteplugins_batcher.batch_api._line_errors import RequestLineError

INT64 = 2**63
"""Integers a request may give lie in [-INT64, INT64)."""


class FieldChecks:
    """Checks one request's fields, failing its line with the field named as written (`body.top_p`).

    Args:
        prefix: What the request's fields are under (`"body."` for an OpenAI line, `""` for a plain one).
        line: The request's line number.
        custom_id: The request's id.
        context_length: The model's context, when known (0: unknown); a token limit that fills it is refused.
    """

    def __init__(self, prefix: str, line: int, custom_id: str | None, *, context_length: int = 0) -> None:
        self.prefix = prefix
        self.line = line
        self.custom_id = custom_id
        self.context_length = context_length

    def fail(self, code: str, message: str) -> RequestLineError:
        """The error for this request's line."""
        return RequestLineError(code, message, line=self.line, custom_id=self.custom_id)

    def invalid(self, key: str, message: str) -> RequestLineError:
        """An `invalid_request` naming field `key`."""
        return self.fail("invalid_request", f"{self.prefix}{key} {message}")

    def integer(self, data: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
        """The integer at `key` (None when absent), within [low, high]."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.invalid(key, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise self.invalid(key, f"must be {_range_text(low, high)}, got {value!r}")
        return value

    def number(self, data: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
        """The finite number at `key` (None when absent), within [low, high]."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.invalid(key, f"must be a number, got {value!r}")
        if not low <= value <= high:
            raise self.invalid(key, f"must be from {low:g} to {high:g}, got {value!r}")
        return float(value)

    def boolean(self, data: Mapping[str, Any], key: str) -> bool | None:
        """The JSON boolean at `key` (None when absent): `"yes"`, `1` or `"true"` are refused, not taken as true."""
        value = data.get(key)
        if value is not None and not isinstance(value, bool):
            raise self.invalid(key, f"must be true or false, got {value!r}")
        return value


def _range_text(low: int, high: int) -> str:
    if high >= INT64 - 1:
        return f">= {low}" if low > -INT64 else "a 64-bit integer"
    return f"from {low} to {high}"
