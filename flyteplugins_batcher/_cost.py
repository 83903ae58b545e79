"""Costing a record: explicit cost > estimator function > the record's own method > default; and its budget.

The default is a number, or (`default_cost="length"`, `@batched`'s default) the record's length:
`len(record)` for a record that has one and is not a mapping (a `str`, `bytes`, list, tuple, array),
else 1. A mapping's length counts its keys, which says nothing about the work it asks for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sized
from typing import Any

from flyteplugins_batcher._errors import CostBudgetExceededError, add_note, short_repr
from flyteplugins_batcher._settings import LENGTH

_NO_LENGTH_COST = 1


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
            if self._by_length and issubclass(record_type, Sized) and not issubclass(record_type, Mapping):
                found = (_length, "its length")
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


def _length(record: Sized) -> int:
    try:
        return len(record)
    except TypeError:  # a type with `__len__` whose instance has no length (a 0-d array)
        return _NO_LENGTH_COST
