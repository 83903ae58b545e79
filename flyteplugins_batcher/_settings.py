"""`BatcherSettings`: every tunable of a batcher as one frozen, validated value.

`DynamicBatcher`, `TokenBatcher`, `@batched` and the engines' `batcher_defaults()` all build one,
so a setting's default and validation live here alone, and a misspelt keyword fails where it is
written.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from flyteplugins_batcher._deprecation import warn_deprecated

OnError = Literal["raise", "split"]
Oversized = Literal["run_alone", "reject"]
Grouping = Literal["fifo", "by_cost", "by_prefix"]
GROUPINGS: tuple[str, ...] = typing.get_args(Grouping)
LENGTH: Literal["length"] = "length"
"""`default_cost="length"`: a record that has a length costs it (a text: its words and punctuation marks)."""

NO_BUDGET = sys.maxsize
"""The batch budget when `target_batch_cost` is `None`: no sum of costs reaches it."""

BATCHED_DEFAULTS: Mapping[str, Any] = MappingProxyType({"grouping": "by_cost"})
"""Where `@batched`'s defaults differ from the batchers' (which keep flyte.extras'): batches of similar cost."""

LENGTH_COST_DEFAULTS: Mapping[str, Any] = MappingProxyType({"default_cost": LENGTH, "target_batch_cost": None})
"""`@batched`'s further defaults when nothing else costs the records (a `DynamicBatcher` with no
`cost_estimator`): a record costs its length, and no budget binds unless one is given. A length
budget is the user's choice: flyte.extras' 32,000 would cut batches of long texts short."""

TOKEN_KEYWORDS: Mapping[str, str] = {
    "target_batch_tokens": "target_batch_cost",
    "default_token_estimate": "default_cost",
    "max_in_flight_tokens": "max_in_flight_cost",
}
"""`TokenBatcher`'s names for `DynamicBatcher` settings."""

DEPRECATED_KEYWORDS: Mapping[str, str] = {
    "max_inflight_cost": "max_in_flight_cost",
    "max_inflight_tokens": "max_in_flight_tokens",
}
"""Spellings of 0.1.0 that still work, with a `DeprecationWarning`."""

ClassT = TypeVar("ClassT", bound=type)


def _accepts_deprecated_keywords(cls: ClassT) -> ClassT:
    """Let the dataclass's own `__init__` take the deprecated spellings too (with a warning)."""
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self: Any, *args: Any, **keywords: Any) -> None:
        generated(self, *args, **_current_names(keywords))

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


@_accepts_deprecated_keywords
@dataclass(frozen=True)
class BatcherSettings:
    """How a batcher forms and runs batches; see the README's configuration table.

    The one place that gives each setting its default and checks it: the batchers' keywords are
    these fields. Build it with keywords (token-named ones such as `target_batch_tokens` are
    accepted by `from_keywords`), derive variants with `replace`. Invalid values raise
    `ValueError` at construction; unknown keywords raise `TypeError` naming the closest valid one.

    Attributes:
        target_batch_cost: Cost budget per batch, a hard limit (`target_batch_tokens`); `None`: no
            budget, batches are bounded by `max_batch_size` alone.
        max_batch_size: Most records per batch.
        min_batch_size: Records to wait for before an idle device takes a batch; the batch goes
            anyway once its oldest record has waited `batch_timeout_s`.
        batch_timeout_s: Longest a record waits for its batch to fill, counted from its submit.
        max_queue_size: Records that may wait beyond the staged batches and the batch being
            assembled; `submit` awaits when full. 0 or less: unbounded.
        prefetch_batches: Full batches assembled ahead and staged at the device, so the next batch
            starts the moment the previous one returns.
        default_cost: Cost of a record nothing else estimates (`default_token_estimate`); `"length"`:
            its length: a `str`'s words and punctuation marks (about its token count), the `len()`
            of another record that has one and is not a mapping (`bytes`, list, tuple, array),
            else 1.
        max_concurrent_batches: Batches inside the process function at once.
        max_in_flight_cost: Summed cost of the batches in flight (`max_in_flight_tokens`); `None`
            means `target_batch_cost * max_concurrent_batches`. Formerly `max_inflight_cost`.
        on_error: `"raise"` fails a whole batch with its exception; `"split"` bisects it to
            isolate the failing records.
        oversized: A record costlier than the budget: `"run_alone"` or `"reject"` at submit.
        grouping: `"fifo"` forms batches in submission order; `"by_cost"` puts records of similar
            cost together (always including the oldest waiting record), so that padded batches
            waste little; `"by_prefix"` puts records that share a prompt prefix together (the
            oldest waiting record, the records of its prefix key, then those whose keys share the
            longest prefix with it), so that an engine with a prefix cache (vLLM) computes a shared
            prefix once. A record's key: the batcher's `prefix_key` function, else its own
            `prefix_key()` method, else a `str` record's text (`bytes`: its bytes); records without
            one are grouped among themselves as `"by_cost"` groups them.
        priority_aging_s: A waiting record gains one priority level per this many seconds, so low
            priorities cannot starve; `None` means strict priorities.
        latency_slo_s: The latency target: seconds from `submit` to the result that `slo_quantile` of
            the records must meet; a mapping `{priority: seconds}` gives the records of each listed
            priority their own (records of unlisted priorities have none, and fill the device
            around the others). With it, the batcher learns how long its batches take as it runs and
            chooses their size, its wait and its work in flight to meet the target at the load it
            sees; `max_batch_size`, `target_batch_cost`, `batch_timeout_s` and `max_in_flight_cost`
            become bounds. `BatchStats.slo` shows the target, the share met and the choice, and
            `overloaded` when no choice can meet it. `None`: no target, the knobs alone decide.
        slo_quantile: The share of records that must meet `latency_slo_s` (0.99: the p99).

    Example:
        ```python
        settings = BatcherSettings(max_batch_size=64, grouping="by_cost")
        batcher = DynamicBatcher.from_settings(embed, settings.replace(batch_timeout_s=0.01))
        ```
    """

    # flyte.extras' settings, with its defaults.
    target_batch_cost: int | None = 32_000
    max_batch_size: int = 256
    min_batch_size: int = 1
    batch_timeout_s: float = 0.05
    max_queue_size: int = 5_000
    prefetch_batches: int = 2
    default_cost: int | Literal["length"] = 1
    # Ours.
    max_concurrent_batches: int = 1
    max_in_flight_cost: int | None = None
    on_error: OnError = "raise"
    oversized: Oversized = "run_alone"
    grouping: Grouping = "fifo"
    priority_aging_s: float | None = 10.0
    latency_slo_s: float | Mapping[int, float] | None = None
    slo_quantile: float = 0.99

    def __post_init__(self) -> None:
        _require(
            self.target_batch_cost is None or self.target_batch_cost > 0,
            f"target_batch_cost must be > 0 or None, got {self.target_batch_cost}",
        )
        _require(self.max_batch_size >= 1, f"max_batch_size must be >= 1, got {self.max_batch_size}")
        _require(
            1 <= self.min_batch_size <= self.max_batch_size,
            f"min_batch_size must be between 1 and max_batch_size ({self.max_batch_size}), got {self.min_batch_size}",
        )
        _require(
            self.batch_timeout_s >= 0 and math.isfinite(self.batch_timeout_s),
            f"batch_timeout_s must be >= 0, got {self.batch_timeout_s}",
        )
        _require(self.prefetch_batches >= 0, f"prefetch_batches must be >= 0, got {self.prefetch_batches}")
        _require(
            self.default_cost == LENGTH or (isinstance(self.default_cost, int) and self.default_cost >= 0),
            f"default_cost must be an int >= 0 or 'length', got {self.default_cost!r}",
        )
        _require(
            self.max_concurrent_batches >= 1, f"max_concurrent_batches must be >= 1, got {self.max_concurrent_batches}"
        )
        _require(
            self.max_in_flight_cost is None or self.max_in_flight_cost > 0,
            f"max_in_flight_cost must be > 0, got {self.max_in_flight_cost}",
        )
        _require(self.on_error in ("raise", "split"), f"on_error must be 'raise' or 'split', got {self.on_error!r}")
        _require(
            self.oversized in ("run_alone", "reject"),
            f"oversized must be 'run_alone' or 'reject', got {self.oversized!r}",
        )
        _require(
            self.grouping in GROUPINGS,
            f"grouping must be one of {', '.join(map(repr, GROUPINGS))}, got {self.grouping!r}",
        )
        _require(
            self.priority_aging_s is None or self.priority_aging_s > 0,
            f"priority_aging_s must be > 0 or None, got {self.priority_aging_s}",
        )
        if isinstance(self.latency_slo_s, Mapping):
            # A copy of its own, so that a caller changing their dict later cannot change frozen settings.
            object.__setattr__(self, "latency_slo_s", dict(self.latency_slo_s))
        _require(_valid_slo(self.latency_slo_s), _slo_message(self.latency_slo_s))
        _require(0 < self.slo_quantile < 1, f"slo_quantile must be between 0 and 1, got {self.slo_quantile}")

    @property
    def batch_budget(self) -> int:
        """The bound on a batch's summed cost: `target_batch_cost`, or `NO_BUDGET` when it is `None`."""
        return NO_BUDGET if self.target_batch_cost is None else self.target_batch_cost

    def slo_of(self, priority: int) -> float | None:
        """The latency target of a record of `priority`, in seconds (`None`: it has none)."""
        slo = self.latency_slo_s
        return slo.get(priority) if isinstance(slo, Mapping) else slo

    @property
    def chooses_from_waiting(self) -> bool:
        """Whether batches are chosen from everything waiting (`by_cost`, `by_prefix`), not cut in arrival order.

        Such batches are best formed when a runner takes one, from the most records: a batch staged
        ahead would be chosen from fewer.
        """
        return self.grouping != "fifo"

    @property
    def in_flight_cost_limit(self) -> int:
        """The bound on the summed cost of batches in flight."""
        if self.max_in_flight_cost is not None:
            return self.max_in_flight_cost
        if self.target_batch_cost is None:
            return NO_BUDGET
        return self.target_batch_cost * self.max_concurrent_batches

    @property
    def max_inflight_cost(self) -> int | None:
        """Deprecated spelling of `max_in_flight_cost`."""
        warn_deprecated("max_inflight_cost", "max_in_flight_cost")
        return self.max_in_flight_cost

    @property
    def inflight_cost_limit(self) -> int:
        """Deprecated spelling of `in_flight_cost_limit`."""
        warn_deprecated("inflight_cost_limit", "in_flight_cost_limit")
        return self.in_flight_cost_limit

    @property
    def queue_capacity(self) -> int:
        """Records that may wait unstaged (0: unbounded): `max_queue_size` plus the batch being assembled.

        With `prefetch_batches` staged batches and the batches in flight, this is what flyte.extras
        holds before `submit` blocks.
        """
        return self.max_queue_size + self.max_batch_size if self.max_queue_size > 0 else 0

    @classmethod
    def from_keywords(cls, **keywords: Any) -> BatcherSettings:
        """Settings from `DynamicBatcher` or `TokenBatcher` keywords.

        Raises:
            TypeError: A keyword is not a setting (the message suggests the closest one), or a
                setting is given under both its cost and its token name.
        """
        return cls().replace(**keywords)

    def replace(self, **changes: Any) -> BatcherSettings:
        """A copy with `changes` applied; token-named keywords are accepted.

        Raises:
            TypeError: As `from_keywords`.
            ValueError: A changed value is invalid.
        """
        return dataclasses.replace(self, **normalize_keywords(changes))

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict of `DynamicBatcher` keywords."""
        return dataclasses.asdict(self)


SETTING_NAMES: frozenset[str] = frozenset(field.name for field in dataclasses.fields(BatcherSettings))


def normalize_keywords(keywords: Mapping[str, Any], *, token_names_win: bool = False) -> dict[str, Any]:
    """Map token names and deprecated spellings onto setting names, and reject anything that is not a setting.

    A token name given as `None` counts as not given (as in `flyte.extras.TokenBatcher`).

    Args:
        keywords: Settings by any of their names.
        token_names_win: A token name given beside its cost name wins, as in
            `flyte.extras.TokenBatcher`; otherwise that is an error.

    Raises:
        TypeError: Unknown keyword (with the closest valid name), or one setting given twice.
    """
    normalized: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    token_values: dict[str, Any] = {}
    for name, value in _current_names(keywords).items():
        setting = TOKEN_KEYWORDS.get(name, name)
        if setting not in SETTING_NAMES:
            raise TypeError(f"{name!r} is not a batcher setting{_suggestion(name)}")
        if setting != name and (value is None or token_names_win):
            if value is not None:
                token_values[setting] = value
            continue
        if setting in normalized:
            raise TypeError(f"{setting!r} given twice (as {given_as[setting]!r} and {name!r})")
        normalized[setting], given_as[setting] = value, name
    normalized.update(token_values)
    return normalized


def _current_names(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """`keywords` with deprecated spellings replaced by their current names (each warns, once per process)."""
    if not any(name in DEPRECATED_KEYWORDS for name in keywords):
        return dict(keywords)
    current: dict[str, Any] = {}
    for name, value in keywords.items():
        new_name = DEPRECATED_KEYWORDS.get(name)
        if new_name is not None:
            warn_deprecated(name, new_name)
            if new_name in keywords:
                raise TypeError(f"{new_name!r} given twice (as {new_name!r} and {name!r})")
            name = new_name
        current[name] = value
    return current


@dataclass(frozen=True)
class BatcherOptions:
    """Everything that builds a batcher besides its process function: settings, functions of a record, and name.

    `parse` takes the keywords of `DynamicBatcher` or `TokenBatcher` (cost or token names), so
    that callers like `@batched` and `Engine.batcher()` validate them once, where they are written.
    """

    settings: BatcherSettings
    cost_estimator: Callable[[Any], Any] | None = None
    name: str | None = None
    prefix_key: Callable[[Any], Any] | None = None

    @classmethod
    def parse(cls, keywords: Mapping[str, Any], base: BatcherSettings | None = None) -> BatcherOptions:
        """Split batcher keywords into settings (applied over `base`), the cost estimator, the name and the prefix key.

        Raises:
            TypeError: An unknown keyword, or the estimator given under both of its names.
            ValueError: An invalid setting.
        """
        settings, estimator, name, prefix_key = _split_options(keywords)
        return cls((base or BatcherSettings()).replace(**settings), estimator, name, prefix_key)

    @classmethod
    def for_batched(cls, keywords: Mapping[str, Any], *, length_costs: bool = True) -> BatcherOptions:
        """`@batched`'s options: its keywords over its defaults, which differ from the batchers'.

        Records are grouped by cost (`BATCHED_DEFAULTS`). When nothing else costs them (no
        estimator is given, and `length_costs`: the batcher's costs are not tokens), a record
        costs its length and no budget binds unless one is given (`LENGTH_COST_DEFAULTS`). Any
        keyword given wins.

        Raises:
            TypeError: As `parse`.
            ValueError: As `parse`.
        """
        settings, estimator, name, prefix_key = _split_options(keywords)
        defaults = dict(BATCHED_DEFAULTS)
        if estimator is None and length_costs:
            defaults.update(LENGTH_COST_DEFAULTS)
        return cls(BatcherSettings(**defaults).replace(**settings), estimator, name, prefix_key)


_RecordFn = Callable[[Any], Any]
OPTION_NAMES = frozenset({"cost_estimator", "token_estimator", "name", "prefix_key"})
"""The batchers' keywords that are not settings: functions of a record, and the name."""


def _split_options(
    keywords: Mapping[str, Any],
) -> tuple[dict[str, Any], _RecordFn | None, str | None, _RecordFn | None]:
    """Batcher keywords as (settings keywords, cost estimator, name, prefix key function)."""
    remaining = dict(keywords)
    estimators = [remaining.pop(key) for key in ("cost_estimator", "token_estimator") if key in remaining]
    if len(estimators) > 1:
        raise TypeError("give 'cost_estimator' or 'token_estimator', not both")
    name = remaining.pop("name", None)
    prefix_key = remaining.pop("prefix_key", None)
    if prefix_key is not None and not callable(prefix_key):
        raise ValueError(f"prefix_key must be a function of a record, got {type(prefix_key).__name__}")
    return remaining, estimators[0] if estimators else None, name, prefix_key


def _suggestion(name: str) -> str:
    candidates = sorted((SETTING_NAMES | set(TOKEN_KEYWORDS) | OPTION_NAMES) - {name})
    close = difflib.get_close_matches(name, candidates, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid settings: {', '.join(candidates)}"


def _is_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _valid_slo(slo: Any) -> bool:
    if slo is None or _is_seconds(slo):
        return True
    if not isinstance(slo, Mapping) or not slo:
        return False
    return all(isinstance(key, int) and not isinstance(key, bool) and _is_seconds(value) for key, value in slo.items())


def _slo_message(slo: Any) -> str:
    return f"latency_slo_s must be seconds > 0, a non-empty {{priority: seconds > 0}} mapping, or None; got {slo!r}"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
