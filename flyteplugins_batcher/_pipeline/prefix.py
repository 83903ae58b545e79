"""A record's prefix key, for `grouping="by_prefix"`: the `prefix_key` function > the record's own method > its text.

Records whose keys share a long beginning share a long prompt prefix, which an engine with a
prefix cache (vLLM) computes once when they run together. The key is compared by its common
beginning with other keys, never parsed: any text that begins alike where the prompts do will do
(the prompt itself, or a document's id followed by the question). A key is:

- what the batcher's `prefix_key` function returns for the record, if it has one;
- else what the record's own `prefix_key()` method returns (the engines' `Request`, `Prompt`);
- else a `str` record's text, or a `bytes` record's bytes;
- else none: the record is grouped with the others that have none, by cost (as `grouping="by_cost"`).

A key is a `str`, `bytes` (read as Latin-1, so that byte order and common beginnings are kept)
or `None` (no key).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flyteplugins_batcher._errors import add_note, short_repr
from flyteplugins_batcher._settings import BatcherSettings

KeyFn = Callable[[Any], Any]


class PrefixResolver:
    """Decides a record's prefix key (see the module notes).

    Args:
        batcher_name: The batcher's name, for error messages.
        key_fn: `f(record) -> str | bytes | None`, or `None`.

    Example:
        ```python
        keys = PrefixResolver("llm", key_fn=lambda row: row.document_id)
        assert keys.resolve("plain text") == "plain text"
        ```
    """

    def __init__(self, batcher_name: str, key_fn: KeyFn | None) -> None:
        self._batcher_name = batcher_name
        self._key_fn = key_fn
        self._method_by_type: dict[type, tuple[KeyFn | None, str]] = {}

    @classmethod
    def of(cls, settings: BatcherSettings, batcher_name: str, key_fn: KeyFn | None) -> PrefixResolver | None:
        """The resolver a batcher with `settings` needs: `None` unless it groups by prefix.

        Raises:
            ValueError: `key_fn` is given and is not callable.
        """
        if key_fn is not None and not callable(key_fn):
            raise ValueError(f"prefix_key must be a function of a record, got {type(key_fn).__name__}")
        return cls(batcher_name, key_fn) if settings.grouping == "by_prefix" else None

    def resolve(self, record: Any) -> str | None:
        """The record's key as text, or `None` when it has none.

        Raises:
            ValueError: The key is not a `str`, `bytes` or `None`; the message names the record.
            Exception: Whatever the key function raised, with a note naming the record.
        """
        key_fn, source = (self._key_fn, "prefix_key") if self._key_fn is not None else self._method_for(type(record))
        if key_fn is None:
            return None
        try:
            key = key_fn(record)
        except Exception as exc:
            add_note(exc, f"{self._batcher_name}: {source} failed for {short_repr(record)}")
            raise
        if key is None or type(key) is str:
            return key
        if isinstance(key, (bytes, bytearray, memoryview)):
            return bytes(key).decode("latin-1")
        if isinstance(key, str):  # a subclass of str
            return str(key)
        raise ValueError(
            f"{self._batcher_name}: {source} gave {short_repr(key)} for {short_repr(record)}; "
            "a prefix key must be a str, bytes or None"
        )

    def _method_for(self, record_type: type) -> tuple[KeyFn | None, str]:
        """How a record of this type gets its key when the batcher has no function: decided once per type."""
        try:
            return self._method_by_type[record_type]
        except KeyError:
            pass
        found: tuple[KeyFn | None, str] = (None, "")
        method = getattr(record_type, "prefix_key", None)
        if callable(method):
            found = (method, "the record's prefix_key()")
        elif issubclass(record_type, (str, bytes, bytearray)):
            found = (_itself, "the record's text")
        self._method_by_type[record_type] = found
        return found


def _itself(record: Any) -> Any:
    return record
