"""TokenBatcher: the DynamicBatcher with token-named keywords, for LLM inference."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from typing_extensions import Unpack

from flyteplugins_batcher._batcher import DynamicBatcher
from flyteplugins_batcher._keywords import TokenSettingsKeywords, with_estimated_tokens, with_settings_signature
from flyteplugins_batcher._pipeline.prefix import KeyFn
from flyteplugins_batcher._settings import BatcherOptions, BatcherSettings, normalize_keywords
from flyteplugins_batcher._types import CostEstimatorFn, ProcessFn, RecordT, ResultT


class TokenBatcher(DynamicBatcher[RecordT, ResultT]):
    """Token-budgeted batcher for LLM inference; a drop-in for `flyte.extras.TokenBatcher`.

    Accepts token-named keywords and maps them onto `DynamicBatcher`: `inference_fn` (or
    `process_fn`), `token_estimator` (or `cost_estimator`), `target_batch_tokens` (or
    `target_batch_cost`), `default_token_estimate` (or `default_cost`), and
    `max_in_flight_tokens` (or `max_in_flight_cost`); as in flyte.extras, a token name given
    (not `None`) wins over its cost name. Records are costed by an explicit
    `estimated_tokens`/`estimated_cost`, then the estimator function, then
    `record.estimate_tokens()`, then `record.estimate_cost()`, then the default. With
    `grouping="by_prefix"`, `prefix_key` (or `record.prefix_key()`, or a `str` record's text) says
    which records share a prompt prefix (see `DynamicBatcher`); `engine.batcher()` gives the engine's.

    Example:
        ```python
        engine = create_engine()  # bundled SmolLM2 on CPU, vLLM on a GPU
        engine.load()
        async with TokenBatcher(
            inference_fn=engine.generate,  # plain def: runs in a worker thread
            token_estimator=engine.estimate_tokens,
            target_batch_tokens=8_192,
        ) as batcher:
            completion = await (await batcher.submit(Prompt(text="What is 2 + 2?")))
        ```
    """

    _cost_protocols = ("estimate_tokens", "estimate_cost")

    @with_settings_signature(token_names=True)
    def __init__(
        self,
        inference_fn: ProcessFn[RecordT, ResultT] | None = None,
        *,
        process_fn: ProcessFn[RecordT, ResultT] | None = None,
        token_estimator: CostEstimatorFn[RecordT] | None = None,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        name: str | None = None,
        prefix_key: KeyFn | None = None,
        **settings: Unpack[TokenSettingsKeywords],
    ) -> None:
        fn = inference_fn or process_fn
        if fn is None:
            raise TypeError("TokenBatcher requires either 'inference_fn' or 'process_fn'")
        values = normalize_keywords(settings, token_names_win=True)
        self._setup(fn, BatcherOptions(BatcherSettings(**values), token_estimator or cost_estimator, name, prefix_key))

    @with_estimated_tokens(DynamicBatcher.submit)
    async def submit(
        self, record: RecordT, *, estimated_tokens: int | None = None, estimated_cost: int | None = None, **options: Any
    ) -> asyncio.Future[ResultT]:
        """Queue one record for batched inference; returns a future for its result (see `DynamicBatcher.submit`).

        `estimated_tokens` is its cost by its token name, and wins over `estimated_cost`; the other
        keywords are `DynamicBatcher.submit`'s.
        """
        cost = estimated_tokens if estimated_tokens is not None else estimated_cost
        return await super().submit(record, estimated_cost=cost, **options)

    @with_estimated_tokens(DynamicBatcher.submit_batch)
    async def submit_batch(
        self,
        records: Sequence[RecordT],
        *,
        estimated_tokens: Sequence[int] | None = None,
        estimated_cost: Sequence[int] | None = None,
        **options: Any,
    ) -> list[asyncio.Future[ResultT]]:
        """Submit several records; their futures in order (see `DynamicBatcher.submit_batch`).

        `estimated_tokens`, per-record token counts as long as `records`, wins over `estimated_cost`;
        the other keywords are `DynamicBatcher.submit_batch`'s.
        """
        costs = estimated_tokens if estimated_tokens is not None else estimated_cost
        return await super().submit_batch(records, estimated_cost=costs, **options)
