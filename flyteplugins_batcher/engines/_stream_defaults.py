"""Batcher settings for an engine that schedules requests itself (vLLM's `AsyncLLM`, the simulated engine)."""

from __future__ import annotations

from flyteplugins_batcher import BatcherSettings

STREAM_OVERCOMMIT = 2
"""Estimated tokens in flight may reach this multiple of the KV cache: estimates count every record's
full `max_new_tokens` although most stop earlier, and the engine needs a waiting queue to refill
slots the moment sequences finish."""


def stream_batcher_settings(
    max_num_seqs: int, kv_cache_tokens: int, max_model_len: int | None = None
) -> BatcherSettings:
    """Batches of one record dispatched at once, up to `max(1024, 4 * max_num_seqs)` in flight.

    Each record reaches the engine the moment it arrives, and the engine's own continuous batching
    fills its slots. Estimated tokens in flight are bounded at `STREAM_OVERCOMMIT` KV caches, but
    never below `STREAM_OVERCOMMIT * max_num_seqs` records of the longest estimate there can be
    (`max_model_len`): an estimate counts a record's whole `max_new_tokens`, so with a large
    `max_tokens` (2,048 against a 442k-token cache) the KV bound alone would admit 400 records to
    an engine with 1,024 slots. The engine manages its cache itself (it preempts when real outputs
    fill it); the bound only keeps the rest of the queue here rather than in the engine's.
    """
    floor = max_num_seqs * max_model_len if max_model_len else 0
    return BatcherSettings(
        max_batch_size=1,
        batch_timeout_s=0.0,
        max_concurrent_batches=max(1024, 4 * max_num_seqs),
        max_in_flight_cost=STREAM_OVERCOMMIT * max(kv_cache_tokens, floor),
    )
