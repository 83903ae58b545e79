"""The batchers' setting keywords, derived from `BatcherSettings` so that it stays their one source.

`DynamicBatcher` and `TokenBatcher` take their settings as `**settings`, typed for type checkers
and IDEs by the `TypedDict`s below (names and types; the defaults are `BatcherSettings`'), and
shown by `inspect.signature` with the names and defaults of `BatcherSettings`' fields, exactly as
`flyte.extras` spells them. `BatcherSettings` validates the values and suggests the closest name
for a misspelt one.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict, TypeVar

from flyteplugins_batcher._settings import TOKEN_KEYWORDS, BatcherSettings, Grouping, OnError, Oversized

FunctionT = TypeVar("FunctionT", bound=Callable[..., Any])


class SettingsKeywords(TypedDict, total=False):
    """`DynamicBatcher`'s setting keywords: the fields of `BatcherSettings`, which gives their defaults."""

    target_batch_cost: int | None
    max_batch_size: int
    min_batch_size: int
    batch_timeout_s: float
    max_queue_size: int
    prefetch_batches: int
    default_cost: int | Literal["length"]
    max_concurrent_batches: int
    max_in_flight_cost: int | None
    on_error: OnError
    oversized: Oversized
    grouping: Grouping
    priority_aging_s: float | None
    latency_slo_s: float | Mapping[int, float] | None
    slo_quantile: float
    max_inflight_cost: int | None  # deprecated spelling of max_in_flight_cost


class TokenSettingsKeywords(SettingsKeywords, total=False):
    """`TokenBatcher`'s setting keywords: the cost-named ones, and token names that win over them when given."""

    target_batch_tokens: int | None
    default_token_estimate: int | None
    max_in_flight_tokens: int | None
    max_inflight_tokens: int | None  # deprecated spelling of max_in_flight_tokens


class SubmitOptions(TypedDict, total=False):
    """`submit`'s keywords besides the record, for callers that pass them on."""

    estimated_cost: int | None
    priority: int
    deadline_s: float | None
    wait_for_room: bool
    latency_slo_s: float | None


_TOKEN_NAME_OF = {setting: token_name for token_name, setting in TOKEN_KEYWORDS.items()}


def settings_parameters(*, token_names: bool = False) -> list[inspect.Parameter]:
    """`BatcherSettings`' fields as keyword-only parameters with their defaults (token names first, `None`)."""
    parameters: list[inspect.Parameter] = []
    for field in dataclasses.fields(BatcherSettings):
        if token_names and field.name in _TOKEN_NAME_OF:
            parameters.append(
                inspect.Parameter(
                    _TOKEN_NAME_OF[field.name], inspect.Parameter.KEYWORD_ONLY, default=None, annotation="int | None"
                )
            )
        parameters.append(
            inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=field.type)
        )
    return parameters


def with_settings_signature(*, token_names: bool = False) -> Callable[[FunctionT], FunctionT]:
    """Decorate a batcher's `__init__`: its signature shows `**settings` as the settings' own keywords.

    Example:
        ```python
        @with_settings_signature()
        def __init__(self, process_fn, *, cost_estimator=None, name=None, **settings: Unpack[SettingsKeywords]): ...
        ```
    """

    def decorate(init: FunctionT) -> FunctionT:
        signature = inspect.signature(init)
        explicit = [
            parameter for parameter in signature.parameters.values() if parameter.kind is not parameter.VAR_KEYWORD
        ]
        init.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*explicit, *settings_parameters(token_names=token_names)]
        )
        return init

    return decorate


def with_estimated_tokens(method: Callable[..., Any]) -> Callable[[FunctionT], FunctionT]:
    """Decorate a `TokenBatcher` method that adds `estimated_tokens` to the `DynamicBatcher` `method` it overrides.

    Its signature is `method`'s, with the override's `estimated_tokens` just before `estimated_cost`: the
    other keywords are written once, on `method`, and the override passes them on as `**options`.

    Example:
        ```python
        @with_estimated_tokens(DynamicBatcher.submit)
        async def submit(self, record, *, estimated_tokens=None, estimated_cost=None, **options): ...
        ```
    """

    def decorate(override: FunctionT) -> FunctionT:
        signature = inspect.signature(method)
        parameters = list(signature.parameters.values())
        cost = [parameter.name for parameter in parameters].index("estimated_cost")
        tokens = inspect.signature(override).parameters["estimated_tokens"]
        override.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*parameters[:cost], tokens, *parameters[cost:]]
        )
        return override

    return decorate
