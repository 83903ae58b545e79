"""The remote engine against vLLM's own server: adaptive concurrency vs a sweep of fixed ones, and 30% of calls 429.

vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`, its CPU build: SmolLM2 in float32,
`--enforce-eager`, a small KV cache, as the table benchmark's engine flags) answers `--lines` chat requests of at
most `--max-tokens` tokens, sent through `create_engine("openai", ...)` and its batcher:

- **fixed C**: the concurrency held at C (`initial_concurrency = max_concurrency = C`), for each C of the sweep;
  the best of them is the oracle;
- **adaptive**: the engine's default, told nothing;
- **adaptive, 30% 429**: the same behind `FaultyProxy` answering 30% of the calls 429 at once (every line must
  still be answered exactly once), against **adaptive, proxy** (the proxy with no errors: its own cost apart).

Goodput: lines answered per second of wall time. Goals: adaptive at least 0.95x the best fixed concurrency; with
30% 429s every line answered once, within 1.5x the time without errors.

Run: `flock /tmp/bench.lock python benchmarks/bench_remote.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._charts import add_chart_flag, write_chart_data
from benchmarks._faulty_proxy import FaultyProxy
from benchmarks.server_process import vllm_server
from flyteplugins_batcher.engines import Completion, GenerationConfig, Request, bundled_smollm2_path, create_engine

TOPICS = ["the ocean", "a mountain", "the moon", "a library", "rain", "a river", "bread", "a clock"]


@dataclass
class Run:
    way: str
    wall_s: float
    answered: int
    failed: int
    output_tokens: int
    peak: float = 0.0
    halvings: int = 0
    retries: int = 0

    @property
    def goodput(self) -> float:
        return self.answered / self.wall_s


def requests(lines: int, max_tokens: int) -> list[Request]:
    generation = GenerationConfig(max_new_tokens=max_tokens)
    return [
        Request(f"Write one sentence about {TOPICS[n % len(TOPICS)]}, number {n}.", generation, id=f"q{n}")
        for n in range(lines)
    ]


def run(way: str, base_url: str, records: list[Request], **options: Any) -> Run:
    engine = create_engine("openai", base_url=base_url, timeout_s=300, **options)
    with engine:

        async def go() -> list[Any]:
            async with engine.batcher() as batcher:
                return await batcher.run(records, return_exceptions=True)

        started = time.perf_counter()
        outcomes = asyncio.run(go())
        wall = time.perf_counter() - started
    done = [outcome for outcome in outcomes if isinstance(outcome, Completion)]
    limit = engine.concurrency
    result = Run(way, wall, len(done), len(outcomes) - len(done), sum(o.completion_tokens for o in done))
    result.peak, result.halvings, result.retries = limit.peak, limit.halvings, engine.retries
    print(
        f"{way:>22}: {wall:6.1f} s, {result.goodput:5.2f} lines/s, {result.failed} failed, "
        f"peak concurrency {limit.peak:.0f}, {limit.halvings} halvings, {engine.retries} retries",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--sweep", default="2,4,8,16,32,64")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    add_chart_flag(parser)
    args = parser.parse_args()
    records = requests(args.lines, args.max_tokens)
    flags = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024"]
    flags += ["--max-num-seqs", str(args.max_num_seqs), "--kv-cache-memory-bytes", str(1 << 30)]
    folder = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    server = vllm_server(folder, str(bundled_smollm2_path()), *flags)
    runs: list[Run] = []
    try:
        base = f"{server.url}/v1"
        run("warm-up", base, records[:16], initial_concurrency=8, max_concurrency=8)
        for fixed in (int(value) for value in args.sweep.split(",")):
            runs.append(run(f"fixed {fixed}", base, records, initial_concurrency=fixed, max_concurrency=fixed))
        runs.append(run("adaptive", base, records))
        with FaultyProxy(server.url, seed=1).running() as proxy:
            runs.append(run("adaptive, proxy", f"{proxy.url}/v1", records))
        with FaultyProxy(server.url, rate_limited=0.3, seed=1).running() as proxy:
            runs.append(run("adaptive, 30% 429", f"{proxy.url}/v1", records))
            print(f"proxy: {dict(proxy.seen)}")
    finally:
        server.stop()
    report(runs, args.lines)
    write_chart_data(
        args.chart_data,
        title=f"{args.lines} chat lines through the remote engine to vLLM's own server",
        unit="lines answered per second of wall time",
        rows=[(run.way, run.goodput) for run in runs],
        note="vLLM's CPU build, SmolLM2 float32, --max-num-seqs 16; FaultyProxy answers 30% 429 (bench_remote.py).",
    )


def report(runs: list[Run], lines: int) -> None:
    by_way = {run.way: run for run in runs}
    best = max((run for run in runs if run.way.startswith("fixed")), key=lambda run: run.goodput)
    adaptive, clean, faulty = by_way["adaptive"], by_way["adaptive, proxy"], by_way["adaptive, 30% 429"]
    print("\n| way | wall time | lines/s | answered | peak concurrency | halvings | retries |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        row = f"| {run.way} | {run.wall_s:.1f} s | {run.goodput:.2f} | {run.answered}/{lines} | {run.peak:.0f} |"
        print(f"{row} {run.halvings} | {run.retries} |")
    print(f"\nadaptive goodput: {adaptive.goodput / best.goodput:.2f}x the best fixed ({best.way})")
    print(f"30% 429: {faulty.answered}/{lines} answered, {faulty.wall_s / clean.wall_s:.2f}x the time without errors")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
