"""Where the time goes: `@batched(max_batch_size=64)` (its default) vs `model.encode(all)`, in one process.

The same corpus and model as `bench_embed.py` (1,024 gsm8k questions and answers, all-MiniLM-L6-v2
on CPU, 8 producers, batches of up to 64). Each way's wall time is split into:

- tokenization: seconds in sentence-transformers' `preprocess` (the tokenizer, in the worker);
- the forward pass: seconds in the model's forward, with its padding (real tokens over padded);
- the rest of `encode` (sorting, normalizing, copying to numpy);
- the worker idle while the run lasts: before the first batch (start-up: the batcher starts and
  the producers submit), between batches (the runner's hand-off: settling, taking the next batch)
  and after the last one (the results travel back to the producers);
- the event loop's own CPU seconds (`time.thread_time` on its thread: submitting, costing,
  settling, waking the producers), which on a 2-core machine compete with the model's threads.

    python benchmarks/profile_embed.py              # median of 3 rounds
    python benchmarks/profile_embed.py --cprofile   # also the event loop's top functions (one round)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import os
import pstats
import statistics
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
from benchmarks._harness import SHARED_GSM8K, benchmark_parser, median_run
from benchmarks._tables import markdown_table
from benchmarks.bench_embed import BATCH, load_corpus, through_batched
from flyteplugins_batcher.engines import EmbeddingModel


@dataclass
class Timeline:
    """What one way's run spent, measured where it happened."""

    wall_s: float = 0.0
    loop_cpu_s: float = 0.0
    tokenize_s: float = 0.0
    forward_s: float = 0.0
    encode_s: float = 0.0
    real_tokens: int = 0
    padded_tokens: int = 0
    calls: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each encode, from the run's start
    forwards: list[tuple[int, int, float]] = field(default_factory=list)  # (rows, padded length, seconds)

    @property
    def idle_before_s(self) -> float:
        return self.calls[0][0] if self.calls else 0.0

    @property
    def idle_between_s(self) -> float:
        return sum(max(0.0, start - end) for (_, end), (start, _) in itertools.pairwise(self.calls))

    @property
    def idle_after_s(self) -> float:
        return self.wall_s - self.calls[-1][1] if self.calls else 0.0


class TimedModel:
    """The sentence transformer, with its tokenizer and forward pass timed as they run."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.timeline = Timeline()
        self.origin = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()
        preprocess = model.preprocess

        def timed_preprocess(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            features = preprocess(*args, **kwargs)
            mask = features["attention_mask"]
            with self._lock:
                self.timeline.tokenize_s += time.perf_counter() - started
                self.timeline.real_tokens += int(mask.sum())
                self.timeline.padded_tokens += int(mask.numel())
            return features

        model.preprocess = timed_preprocess
        model.register_forward_pre_hook(self._before_forward)
        model.register_forward_hook(self._after_forward)

    def _before_forward(self, _module: Any, inputs: Any) -> None:
        self._local.started = time.perf_counter()

    def _after_forward(self, _module: Any, inputs: Any, _output: Any) -> None:
        elapsed = time.perf_counter() - self._local.started
        rows, length = inputs[0]["attention_mask"].shape
        with self._lock:
            self.timeline.forward_s += elapsed
            self.timeline.forwards.append((int(rows), int(length), elapsed))

    def encode(self, texts: list[str]) -> np.ndarray:
        started = time.perf_counter()
        vectors = self.model.encode(texts, batch_size=BATCH, convert_to_numpy=True, normalize_embeddings=True)
        ended = time.perf_counter()
        with self._lock:
            self.timeline.encode_s += ended - started
            self.timeline.calls.append((started - self.origin, ended - self.origin))
        return vectors

    def run(self, way: Callable[[], Any]) -> Timeline:
        self.timeline = Timeline()
        self.origin = time.perf_counter()
        loop_cpu = time.thread_time()
        way()
        self.timeline.loop_cpu_s = time.thread_time() - loop_cpu
        self.timeline.wall_s = time.perf_counter() - self.origin
        self.timeline.calls.sort()
        return self.timeline


def default_batched(model: TimedModel, texts: list[str]) -> list[Any]:
    @ours.batched(max_batch_size=BATCH)
    def embed(batch: list[str]) -> list[np.ndarray]:
        return list(model.encode(batch))

    return asyncio.run(through_batched(embed, texts))


def breakdown(timeline: Timeline) -> list[tuple[str, float]]:
    other_encode = timeline.encode_s - timeline.tokenize_s - timeline.forward_s
    return [
        ("wall", timeline.wall_s),
        ("  tokenization (in the worker)", timeline.tokenize_s),
        ("  forward pass", timeline.forward_s),
        ("  rest of encode (sort, normalize, numpy)", other_encode),
        ("  worker idle before the first batch", timeline.idle_before_s),
        ("  worker idle between batches", timeline.idle_between_s),
        ("  worker idle after the last batch", timeline.idle_after_s),
        ("calling thread CPU (the event loop; in encode(all), the model's own)", timeline.loop_cpu_s),
    ]


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, chart=False, data=SHARED_GSM8K, threads=2, rounds=3)
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--cprofile", action="store_true", help="profile the event loop's thread in one more round")
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    import torch

    torch.set_num_threads(args.threads)
    texts = load_corpus(args.data, args.texts)
    model = TimedModel(EmbeddingModel().load())
    model.encode(texts[:BATCH])  # warm up
    ways: dict[str, Callable[[], Any]] = {
        "model.encode(all)": lambda: model.encode(texts),
        "@batched(max_batch_size=64)": lambda: default_batched(model, texts),
    }
    runs: dict[str, list[Timeline]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            runs[name].append(model.run(way))
    medians = {name: median_run(timelines, lambda timeline: timeline.wall_s) for name, timelines in runs.items()}
    reference = medians["model.encode(all)"].wall_s
    rows: list[list[Any]] = []
    labels = [label for label, _ in breakdown(medians["model.encode(all)"])]
    columns = {name: dict(breakdown(timeline)) for name, timeline in medians.items()}
    for label in labels:
        row: list[Any] = [label]
        for name in ways:
            row += [f"{columns[name][label] * 1000:,.0f}", f"{columns[name][label] / reference:.1%}"]
        rows.append(row)
    for name, timeline in medians.items():
        rows.append([f"padding efficiency, {name}", f"{timeline.real_tokens / timeline.padded_tokens:.0%}", "", "", ""])
        rows.append([f"encode calls, {name}", len(timeline.calls), "", "", ""])
    headers = ["", *[f"{name} {unit}" for name in ways for unit in ("ms", "of encode(all)'s wall")]]
    print(
        f"\n{len(texts)} gsm8k texts, all-MiniLM-L6-v2 on CPU ({args.threads} threads), batches of up to {BATCH}, "
        f"median of {args.rounds} rounds\n"
    )
    print(markdown_table(headers, rows))
    rates = [
        f"{name} {statistics.median(len(texts) / run.wall_s for run in timelines):,.0f}"
        for name, timelines in runs.items()
    ]
    print("\ntexts/s (median): " + ", ".join(rates))
    if args.cprofile:
        profile = cProfile.Profile()  # the calling thread only: the event loop's
        profile.enable()
        default_batched(model, texts)
        profile.disable()
        print("\nThe event loop's thread in one round of @batched (cProfile, by own time):")
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
