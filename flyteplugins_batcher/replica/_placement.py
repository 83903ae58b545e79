"""Prefix-aware placement: requests that share a prompt prefix go to the same chunk, so a replica computes it once.

An engine with a prefix cache (vLLM's automatic prefix caching) computes a prompt's leading blocks
once and reuses them for every later prompt that starts the same way, but only on the replica that
computed them and only while they stay in its cache. A Flyte driver cannot choose the replica a
chunk runs on, so the chunk is the unit of affinity: requests that share a prefix (a document, a
system prompt with few-shot examples) should share a chunk, and chunks of a large group should
follow one another, so that the replicas' caches stay warm.

`place` does this over a window of requests (the driver holds a bounded number at once): it sorts
them by a stand-in for the text the engine will see (`prefix_text`, the engine request's
`prefix_key`: the adapter, tools and messages in the order a chat template renders them), so that
shared prefixes become neighbours, then cuts the sorted run into chunks of at most `chunk_size`
where cutting costs least. A cut between two neighbours costs the prefix they share (the second
chunk computes it again), and every chunk costs `CHUNK_COST_CHARS` (a replica call, a smaller
batch): the cheapest cuts are found exactly, by dynamic programming with a sliding-window minimum,
in linear time. Requests that share nothing fill whole chunks, as in file order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import pairwise
from typing import Literal

from flyteplugins_batcher.engines import GenerationConfig
from flyteplugins_batcher.replica._chunks import RequestItem

Order = Literal["prefix", "file"]
"""How a driver cuts requests into chunks: grouped by shared prefix (`"prefix"`), or in the input's order."""
ORDERS: tuple[Order, ...] = ("prefix", "file")

PLACEMENT_WINDOW = 8192
"""Requests (a table's rows) grouped together at most: a group's members further apart than this are placed apart."""

CHUNK_COST_CHARS = 256
"""What one more chunk costs, in characters of prefix computed again (about 64 tokens)."""

_NO_DEFAULTS = GenerationConfig()  # settings do not change the prompt: any will do


def prefix_text(item: RequestItem) -> str:
    """The stand-in for the prompt an engine renders from `item`, in the order its chat template puts it
    (`Request.prefix_key`: its adapter, tools and template keywords, then its messages' roles and contents)."""
    return item.engine_request(_NO_DEFAULTS).prefix_key() or ""


def check_order(order: str) -> Order:
    """`order`, checked.

    Raises:
        ValueError: It is not one of `ORDERS`.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
    return order  # type: ignore[return-value]


def place(texts: Sequence[str], chunk_size: int) -> list[list[int]]:
    """The positions of `texts` cut into chunks of at most `chunk_size`, shared prefixes together.

    Args:
        texts: Each request's `prefix_text`.
        chunk_size: The most requests a chunk holds.

    Returns:
        Chunks of positions into `texts`, every position once: each chunk in input order, the chunks in the
        order of their first positions. The same input gives the same chunks (a rerun reuses them).

    Example:
        ```python
        place(["doc A: q1", "doc B: q1", "doc A: q2", "doc B: q2"], 2)  # [[0, 2], [1, 3]]
        ```
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not texts:
        return []
    order = sorted(range(len(texts)), key=lambda position: (texts[position], position))
    shared = [0] + [common_prefix_length(texts[before], texts[after]) for before, after in pairwise(order)]
    chunks = [sorted(order[start:end]) for start, end in _cheapest_cuts(shared, chunk_size)]
    return sorted(chunks)  # input order within and across chunks: answers come back as close to it as they can


def _cheapest_cuts(shared: list[int], chunk_size: int) -> list[tuple[int, int]]:
    """The chunks' (start, end) in sorted order that cost least: each chunk `CHUNK_COST_CHARS`, and a chunk that
    starts at `start` > 0 the prefix `shared[start]` its first request shares with the one before.

    `best[end]` is the least cost of the first `end` requests; the chunk that ends there starts at the
    `start` in `[end - chunk_size, end)` with the least `best[start] + shared[start]`, which a deque keeps
    in increasing order as the window slides.
    """
    count = len(shared)
    best = [0] * (count + 1)
    start_of = [0] * (count + 1)
    candidates: deque[int] = deque()  # starts, their costs increasing

    def cost(start: int) -> int:
        return best[start] + (shared[start] if start else 0)

    for end in range(1, count + 1):
        start = end - 1
        while candidates and cost(candidates[-1]) > cost(start):
            candidates.pop()
        candidates.append(start)
        while candidates[0] < end - chunk_size:
            candidates.popleft()
        start_of[end] = candidates[0]
        best[end] = cost(candidates[0]) + CHUNK_COST_CHARS
    cuts: list[tuple[int, int]] = []
    end = count
    while end:
        cuts.append((start_of[end], end))
        end = start_of[end]
    return cuts[::-1]


def common_prefix_length(first: str, second: str) -> int:
    """How many leading characters two texts share (by halving: each comparison runs in C, not character by
    character in Python)."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
