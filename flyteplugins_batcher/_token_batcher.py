"""TokenBatcher: the DynamicBatcher with token-named keywords, for LLM inference."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from flyteplugins_batcher._batcher import DynamicBatcher
from flyteplugins_batcher._records import CostEstimatorFn, ProcessFn, RecordT, ResultT
from flyteplugins_batcher._settings import BatcherSettings, Grouping, OnError, Oversized


class TokenBatcher(DynamicBatcher[RecordT, ResultT]):
    """Token-budgeted batcher for LLM inference; a drop-in for `flyte.extras.TokenBatcher`.

    Accepts token-named keywords and maps them onto `DynamicBatcher`: `inference_fn` (or
    `process_fn`), `token_estimator` (or `cost_estimator`), `target_batch_tokens` (or
    `target_batch_cost`), `default_token_estimate` (or `default_cost`), and
    `max_inflight_tokens` (or `max_inflight_cost`). Records are costed by an explicit
    `estimated_tokens`/`estimated_cost`, then the estimator function, then
    `record.estimate_tokens()`, then `record.estimate_cost()`, then the default.

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

    def __init__(
        self,
        inference_fn: ProcessFn[RecordT, ResultT] | None = None,
        *,
        process_fn: ProcessFn[RecordT, ResultT] | None = None,
        token_estimator: CostEstimatorFn[RecordT] | None = None,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        target_batch_tokens: int | None = None,
        target_batch_cost: int = 32_000,
        default_token_estimate: int | None = None,
        default_cost: int = 1,
        max_batch_size: int = 256,
        min_batch_size: int = 1,
        batch_timeout_s: float = 0.05,
        max_queue_size: int = 5_000,
        prefetch_batches: int = 2,
        max_concurrent_batches: int = 1,
        max_inflight_tokens: int | None = None,
        max_inflight_cost: int | None = None,
        on_error: OnError = "raise",
        oversized: Oversized = "run_alone",
        grouping: Grouping = "fifo",
        priority_aging_s: float | None = 10.0,
        name: str | None = None,
    ) -> None:
        fn = inference_fn or process_fn
        if fn is None:
            raise TypeError("TokenBatcher requires either 'inference_fn' or 'process_fn'")
        settings = BatcherSettings(
            target_batch_cost=target_batch_tokens if target_batch_tokens is not None else target_batch_cost,
            max_batch_size=max_batch_size,
            min_batch_size=min_batch_size,
            batch_timeout_s=batch_timeout_s,
            max_queue_size=max_queue_size,
            prefetch_batches=prefetch_batches,
            default_cost=default_token_estimate if default_token_estimate is not None else default_cost,
            max_concurrent_batches=max_concurrent_batches,
            max_inflight_cost=max_inflight_tokens if max_inflight_tokens is not None else max_inflight_cost,
            on_error=on_error,
            oversized=oversized,
            grouping=grouping,
            priority_aging_s=priority_aging_s,
        )
        self._setup(fn, settings, token_estimator or cost_estimator, name)

    async def submit(
        self,
        record: RecordT,
        *,
        estimated_tokens: int | None = None,
        estimated_cost: int | None = None,
        priority: int = 0,
        deadline_s: float | None = None,
    ) -> asyncio.Future[ResultT]:
        """Queue one record for batched inference; returns a future for its result.

        Args:
            record: The record.
            estimated_tokens: Its token count (takes precedence over `estimated_cost`).
            estimated_cost: Its cost, the base-class name for the same thing.
            priority: Higher goes first (see `DynamicBatcher.submit`).
            deadline_s: Seconds from now after which it must not be dispatched.
        """
        return await super().submit(
            record,
            estimated_cost=estimated_tokens if estimated_tokens is not None else estimated_cost,
            priority=priority,
            deadline_s=deadline_s,
        )

    async def submit_batch(
        self,
        records: Sequence[RecordT],
        *,
        estimated_tokens: Sequence[int] | None = None,
        estimated_cost: Sequence[int] | None = None,
        priority: int = 0,
        deadline_s: float | None = None,
    ) -> list[asyncio.Future[ResultT]]:
        """Submit several records; returns their futures in order.

        Args:
            records: The records.
            estimated_tokens: Optional per-record token counts, as long as `records`.
            estimated_cost: The base-class name for the same thing.
            priority: For every record.
            deadline_s: For every record, from now.
        """
        return await super().submit_batch(
            records,
            estimated_cost=estimated_tokens if estimated_tokens is not None else estimated_cost,
            priority=priority,
            deadline_s=deadline_s,
        )
