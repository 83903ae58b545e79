"""A GPU-like process function that pads each batch to its longest record, and mixed-length Poisson arrivals.

`bench_slo.py` sweeps load with them and the SLO tests drive the batcher with them: a batch takes
`fixed_s` plus `per_padded_token_s` for every token of the batch padded to its longest record, as a
model that pads its inputs does. It sleeps on the event loop's clock, so that on a virtual clock
(`_virtual_clock.py`) it takes exactly its time and no real time.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Doc:
    """A record: its token count."""

    tokens: int


@dataclass(frozen=True)
class PaddedGpu:
    """`fixed_s` a batch plus `per_padded_token_s` per token of the batch padded to its longest record.

    `per_token_s` adds a cost per token as it is (a device that packs its inputs, as vLLM does).
    """

    fixed_s: float = 0.010
    per_padded_token_s: float = 10e-6
    per_token_s: float = 0.0

    def batch_time(self, batch: list[Doc]) -> float:
        """Seconds the batch takes."""
        tokens = [doc.tokens for doc in batch]
        return self.fixed_s + self.per_padded_token_s * len(tokens) * max(tokens) + self.per_token_s * sum(tokens)

    async def __call__(self, batch: list[Doc]) -> list[int]:
        await asyncio.sleep(self.batch_time(batch))
        return [doc.tokens for doc in batch]


def poisson_arrivals(
    rate: float,
    duration_s: float,
    *,
    seed: int,
    median_tokens: int = 64,
    sigma: float = 1.0,
    tokens: tuple[int, int] = (8, 512),
) -> list[tuple[float, Doc]]:
    """Poisson arrivals at `rate` per second for `duration_s`: (seconds from the start, record).

    Token counts are lognormal around `median_tokens`, cut to the `tokens` range.
    """
    rng = random.Random(seed)
    found: list[tuple[float, Doc]] = []
    offset = rng.expovariate(rate)
    while offset < duration_s:
        count = round(rng.lognormvariate(math.log(median_tokens), sigma))
        found.append((offset, Doc(min(max(count, tokens[0]), tokens[1]))))
        offset += rng.expovariate(rate)
    return found
