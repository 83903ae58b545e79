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

Each round runs every way once, in turn, the order rotated by one way each round; each way's median over
`--rounds` is shown, and the ratios round by round (each against its own round's best fixed).

Run: `flock /tmp/bench.lock python benchmarks/bench_remote.py` (`make bench-remote`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._contenders import vllm_engine_flags
from benchmarks._faulty_proxy import FaultyProxy
from benchmarks._harness import VLLM_ENGINE, benchmark_parser, median_run, write_rows_json
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
    mean_in_flight: float = 0.0
    """Calls in flight, sampled every 50 ms over the run: how full the endpoint was kept."""
    round: int = 0

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
        in_flight: list[int] = []

        async def sample() -> None:
            while True:
                in_flight.append(engine.concurrency.in_flight)
                await asyncio.sleep(0.05)

        async def go() -> list[Any]:
            sampling = asyncio.create_task(sample())
            async with engine.batcher() as batcher:
                answered = await batcher.run(records, return_exceptions=True)
            sampling.cancel()
            return answered

        started = time.perf_counter()
        outcomes = asyncio.run(go())
        wall = time.perf_counter() - started
    done = [outcome for outcome in outcomes if isinstance(outcome, Completion)]
    limit = engine.concurrency
    result = Run(way, wall, len(done), len(outcomes) - len(done), sum(o.completion_tokens for o in done))
    result.peak, result.halvings, result.retries = limit.peak, limit.halvings, engine.retries
    result.mean_in_flight = sum(in_flight) / max(len(in_flight), 1)
    print(
        f"{way:>22}: {wall:6.1f} s, {result.goodput:5.2f} lines/s, {result.failed} failed, "
        f"peak concurrency {limit.peak:.0f}, mean in flight {result.mean_in_flight:.1f}, "
        f"{limit.halvings} halvings, {engine.retries} retries",
        flush=True,
    )
    return result


def parse_args() -> argparse.Namespace:
    engine = {**VLLM_ENGINE, "max_model_len": 1024, "max_num_seqs": 16, "kv_cache_gb": 1.0}
    parser = benchmark_parser(__doc__, rounds=1, quick=False, json=None, **engine)
    parser.add_argument("--lines", type=int, default=96, help="chat requests per run")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per answer at most")
    parser.add_argument("--sweep", default="2,4,8,16,32,64", help="the fixed concurrencies, comma-separated")
    args = parser.parse_args()
    if args.quick:
        args.lines, args.max_tokens, args.sweep = 24, 8, "4,16"
    args.sweep = [int(value) for value in args.sweep.split(",")]
    return args


def one_round(base_url: str, server_url: str, records: list[Request], sweep: list[int], number: int) -> list[Run]:
    """Every way once (the fixed sweep, adaptive, adaptive behind the proxy without and with 30% 429s), in an order
    rotated by one each round, so that no way always runs first after a pause or last as the machine fills up."""

    def fixed(concurrency: int) -> Callable[[], Run]:
        return lambda: run(
            f"fixed {concurrency}", base_url, records, initial_concurrency=concurrency, max_concurrency=concurrency
        )

    def proxied(way: str, rate_limited: float) -> Run:
        with FaultyProxy(server_url, rate_limited=rate_limited, seed=1).running() as proxy:
            result = run(way, f"{proxy.url}/v1", records)
        if rate_limited:
            print(f"proxy: {dict(proxy.seen)}", flush=True)
        return result

    ways: list[Callable[[], Run]] = [fixed(concurrency) for concurrency in sweep]
    ways.append(lambda: run("adaptive", base_url, records))
    ways.append(lambda: proxied("adaptive, proxy", 0.0))
    ways.append(lambda: proxied("adaptive, 30% 429", 0.3))
    shift = number % len(ways)
    return [way() for way in ways[shift:] + ways[:shift]]


def paired_ratios(tried: list[Run]) -> tuple[list[float], list[float]]:
    """Per round: adaptive's goodput over that round's best fixed, and the 30% 429 run's time over the clean one's."""
    rounds: dict[int, dict[str, Run]] = {}
    for run_ in tried:
        rounds.setdefault(run_.round, {})[run_.way] = run_
    to_oracle, to_clean = [], []
    for ways in rounds.values():
        best = max(run_.goodput for way, run_ in ways.items() if way.startswith("fixed"))
        to_oracle.append(ways["adaptive"].goodput / best)
        to_clean.append(ways["adaptive, 30% 429"].wall_s / ways["adaptive, proxy"].wall_s)
    return to_oracle, to_clean


def main() -> None:
    args = parse_args()
    records = requests(args.lines, args.max_tokens)
    flags = [*vllm_engine_flags(args), "--kv-cache-memory-bytes", str(int(args.kv_cache_gb * 2**30))]
    folder = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    server = vllm_server(folder, args.model or str(bundled_smollm2_path()), *flags)
    tried: list[Run] = []
    try:
        base = f"{server.url}/v1"
        run("warm-up", base, records[:16], initial_concurrency=8, max_concurrency=8)
        for number in range(args.rounds):
            print(f"round {number + 1} of {args.rounds}", flush=True)
            for result in one_round(base, server.url, records, args.sweep, number):
                result.round = number
                tried.append(result)
    finally:
        server.stop()
    ways = list(dict.fromkeys(run.way for run in tried))
    runs = [median_run([run for run in tried if run.way == way], key=lambda run: run.wall_s) for way in ways]
    report(runs, args.lines, args.rounds)
    to_oracle, to_clean = paired_ratios(tried)
    print("per round, adaptive / that round's best fixed: " + ", ".join(f"{r:.2f}x" for r in to_oracle))
    print("per round, 30% 429 time / adaptive, proxy time: " + ", ".join(f"{r:.2f}x" for r in to_clean))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    write_rows_json(args.json, ROW_HEADERS, [row_values(run) for run in runs])
    write_chart_data(
        args.chart_data,
        title=f"{args.lines} chat lines through the remote engine to vLLM's own server",
        unit="lines answered per second of wall time (higher is better)"
        + (f", median of {args.rounds} rounds" if args.rounds > 1 else ""),
        rows=[(run.way, run.goodput) for run in runs],
        note=f"vLLM's CPU build, SmolLM2 {args.dtype}, --max-num-seqs {args.max_num_seqs}, at most "
        f"{args.max_tokens} tokens per answer; FaultyProxy answers 30% 429 (bench_remote.py).",
    )


ROW_HEADERS = ["way", "wall time", "lines/s", "answered", "peak concurrency", "mean in flight", "halvings", "retries"]


def row_values(run: Run) -> list[Any]:
    measured = [round(run.wall_s, 1), round(run.goodput, 2), run.answered, run.peak, round(run.mean_in_flight, 1)]
    return [run.way, *measured, run.halvings, run.retries]


def report(runs: list[Run], lines: int, rounds: int) -> None:
    by_way = {run.way: run for run in runs}
    best = max((run for run in runs if run.way.startswith("fixed")), key=lambda run: run.goodput)
    adaptive, clean, faulty = by_way["adaptive"], by_way["adaptive, proxy"], by_way["adaptive, 30% 429"]
    print(f"\nmedian of {rounds} rounds (by wall time)")
    print("\n| " + " | ".join(ROW_HEADERS) + " |\n|" + "---|" * len(ROW_HEADERS))
    for run in runs:
        row = f"| {run.way} | {run.wall_s:.1f} s | {run.goodput:.2f} | {run.answered}/{lines} | {run.peak:.0f} |"
        print(f"{row} {run.mean_in_flight:.1f} | {run.halvings} | {run.retries} |")
    print(f"\nadaptive goodput: {adaptive.goodput / best.goodput:.2f}x the best fixed ({best.way}); goal >= 0.95x")
    ratio = faulty.wall_s / clean.wall_s
    print(f"30% 429: {faulty.answered}/{lines} answered, {ratio:.2f}x the time without errors; goal <= 1.5x")


if __name__ == "__main__":
    main()
