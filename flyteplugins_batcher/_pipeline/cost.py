"""Costing a record: explicit cost > estimator function > the record's own method > default; and its budget.

The default is a number, or (`default_cost="length"`, `@batched`'s default) the record's length:

- a `str` counts its words and punctuation marks, each CJK character counting as one: what a
  tokenizer's pre-tokenizer splits a text into, so a close stand-in for its token count, at a
  small fraction of the cost of tokenizing. Characters are a poor one: digits and symbols
  tokenize far more densely than prose (`<<48/2=24>>` is 11 characters and 9 tokens; a
  40-character sentence is about 9 tokens as well). Texts longer than `TEXT_SAMPLE_CHARACTERS`
  are counted on that many characters and scaled up, so that costing a record stays cheap;
- any other record with a `len()` that is not a mapping (`bytes`, a list of token ids, a tuple,
  an array) costs its `len()`. A mapping's length counts its keys, which says nothing of its work;
- a record without a length costs 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sized
from typing import Any

from flyteplugins_batcher._errors import CostBudgetExceededError, add_note, short_repr
from flyteplugins_batcher._settings import LENGTH

_NO_LENGTH_COST = 1
TEXT_SAMPLE_CHARACTERS = 512
_CJK = "\u2e80-\u9fff\uf900-\ufaff"  # CJK scripts, written without spaces: a character is about a token
_PRE_TOKENS = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+|[^\\w\\s]")  # a CJK character, a word, or a punctuation mark


class CostResolver:
    """Decides what a record costs against the batch budget.

    Args:
        batcher_name: The batcher's name, for error messages.
        estimator: `f(record) -> cost`, or `None`.
        default_cost: Cost when nothing else gives one, or `"length"` (see the module notes).
        protocol_methods: Record methods to try, in order (`estimate_tokens`, `estimate_cost`).
    """

    def __init__(
        self,
        batcher_name: str,
        estimator: Callable[[Any], Any] | None,
        default_cost: int | str,
        protocol_methods: tuple[str, ...],
    ) -> None:
        self._batcher_name = batcher_name
        self._estimator = estimator
        self._by_length = default_cost == LENGTH
        self._default_cost = _NO_LENGTH_COST if self._by_length else int(default_cost)
        self._protocol_methods = protocol_methods
        self._method_by_type: dict[type, tuple[Callable[[Any], Any] | None, str]] = {}

    def resolve(self, record: Any, explicit: Any = None) -> int:
        """The record's cost, validated as a number >= 0 (floats round up).

        Raises:
            ValueError: The cost is negative or not a number; the message names the record.
            Exception: Whatever the estimator raised, with a note naming the record.
        """
        if explicit is not None:
            return self._checked(record, explicit, "estimated_cost")
        estimator, source = self._estimator, "cost_estimator"
        if estimator is None:
            estimator, source = self._method_for(type(record))
            if estimator is None:
                return self._default_cost
        try:
            cost = estimator(record)
        except Exception as exc:
            add_note(exc, f"{self._batcher_name}: {source} failed for {short_repr(record)}")
            raise
        return self._checked(record, cost, source)

    def over_budget(self, record: Any, cost: int, budget: int) -> CostBudgetExceededError:
        """The error for a record that can never fit a batch (with `oversized="reject"`)."""
        return CostBudgetExceededError(
            f"{self._batcher_name}: {short_repr(record)} costs {cost}, more than target_batch_cost={budget}; "
            "it can never fit a batch (oversized='reject')"
        )

    def _method_for(self, record_type: type) -> tuple[Callable[[Any], Any] | None, str]:
        """How a record of this type is costed when no estimator is given: its method, its length, or `None`."""
        # isinstance() against a runtime-checkable Protocol or an ABC costs microseconds per call;
        # decide once per record type instead.
        try:
            return self._method_by_type[record_type]
        except KeyError:
            pass
        found: tuple[Callable[[Any], Any] | None, str] = (None, "default_cost")
        for name in self._protocol_methods:
            candidate = getattr(record_type, name, None)
            if callable(candidate):
                found = (candidate, "the record's estimate method")
                break
        else:
            if self._by_length:
                found = _length_method(record_type)
        self._method_by_type[record_type] = found
        return found

    def _checked(self, record: Any, cost: Any, source: str) -> int:
        if type(cost) is int and cost >= 0:
            return cost
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0 and math.isfinite(cost):
            return math.ceil(cost)
        raise ValueError(
            f"{self._batcher_name}: {source} gave {cost!r} for {short_repr(record)}; a cost must be a number >= 0"
        )


def text_length(text: str) -> int:
    """A text's words and punctuation marks (see the module notes): about its token count."""
    characters = len(text)
    if characters <= TEXT_SAMPLE_CHARACTERS:
        return len(_PRE_TOKENS.findall(text))
    sampled = len(_PRE_TOKENS.findall(text, 0, TEXT_SAMPLE_CHARACTERS))
    return math.ceil(sampled * characters / TEXT_SAMPLE_CHARACTERS)


def _length_method(record_type: type) -> tuple[Callable[[Any], Any] | None, str]:
    if issubclass(record_type, str):
        return text_length, "its length in words"
    if issubclass(record_type, Sized) and not issubclass(record_type, Mapping):
        return _length, "its length"
    return None, "default_cost"


def _length(record: Sized) -> int:
    try:
        return len(record)
    except TypeError:  # a type with `__len__` whose instance has no length (a 0-d array)
        return _NO_LENGTH_COST
