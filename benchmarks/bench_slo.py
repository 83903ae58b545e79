"""A latency target instead of knobs: the highest load each batcher serves within a 250-ms p99 (simulated GPU).

The device: a GPU-like process function whose batch takes 10 ms plus 10 µs per *padded* token (the
batch's records times its longest record). The records: Poisson arrivals of mixed length, tokens
lognormal (median 64, sigma 1.0) cut to 8-512. The target: 99% of the records answered within
250 ms of their arrival. At each offered load, every contender serves the same arrivals:

- ours with `latency_slo_s=0.25` (and `grouping="by_cost"`, as `@batched` groups by default), no other knob;
- ours without a target, on a grid of static configurations (`max_batch_size` x `grouping`): the
  best of them at each load is an oracle that knows the load in advance;
- flyte.extras' `DynamicBatcher` with its defaults;
- the batch inference guide's `AdaptiveBatcher` policy with `target_latency_ms=250`: a batch goes
  when the queue holds `batch_size` records, and `batch_size` steps up by one while the mean
  processing time of the last ten batches is under 0.8 of the target, down above 1.2.

Latency is measured from each record's scheduled arrival (so a producer held back by a full queue
counts), over the records that arrive after the first `--warmup` seconds; throughput is the records
completed per second while the arrivals last. Records still unanswered `--drain` seconds after the
arrivals end count with their latency so far.

With `--clock virtual` (the default) the device and the arrivals run on a virtual clock
(`benchmarks/_virtual_clock.py`): a sweep of minutes of simulated traffic takes a couple of minutes
on a busy 2-core machine, the same on every run, and no pause of the machine shows in a tail
latency. The batchers' own CPU time and the lateness of their timers are not on that clock.

With `--clock real` the same device (`asyncio.sleep`) and arrivals run in real time, with what the
virtual clock leaves out: the batchers' own CPU time, timers that fire late, a shared machine's
pauses. A run takes its seconds, so the sweep is shorter (loads 200-500, fewer contenders: ours,
static 8/16/32/64 by cost, flyte.extras), each contender runs `--rounds` times, alternated, and
the tables show medians. Latency counts from `submit` (the producer's own lateness is the event
loop's, not the batcher's).

    python benchmarks/bench_slo.py                       # the sweep, about 3 minutes
    python benchmarks/bench_slo.py --quick               # fewer loads and shorter runs
    python benchmarks/bench_slo.py --clock real          # in real time: 3 rounds, about 25 minutes
    python benchmarks/bench_slo.py --chart-data docs/benchmarks/data/slo.json && python benchmarks/render_charts.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._virtual_clock import install


def clock_flag() -> str:
    """`--clock` from the command line, read before the batchers are imported (they keep `time.monotonic`)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--clock", choices=("virtual", "real"), default="virtual")
    return early.parse_known_args()[0].clock


CLOCK = install() if clock_flag() == "virtual" else None

from flyte import extras  # noqa: E402

import flyteplugins_batcher as ours  # noqa: E402
from benchmarks._harness import benchmark_parser, round_order  # noqa: E402
from benchmarks._line_charts import LineChartData, Panel, write_line_chart_data  # noqa: E402
from benchmarks._padded_gpu import Doc, PaddedGpu, poisson_arrivals  # noqa: E402
from benchmarks._tables import markdown_table  # noqa: E402

SLO_S = 0.25
QUANTILE = 0.99
device = PaddedGpu(fixed_s=0.010, per_padded_token_s=10e-6)
STATIC_SIZES = (4, 8, 16, 32, 64, 128)
GROUPINGS = ("fifo", "by_cost")


class GuideAdaptiveBatcher:
    """The batch inference guide's `AdaptiveBatcher` policy, with the batchers' `start`/`submit`/`stop`.

    A batch goes when the queue holds `batch_size` records (at `stop`, what is left goes too);
    after each batch, the mean processing time of the last ten is compared with the target, and
    `batch_size` steps up by one under 0.8 of it, down by one above 1.2.
    """

    def __init__(self, process_fn: Callable[[list[Doc]], Any], target_latency_s: float, batch_size: int = 8) -> None:
        self._process_fn = process_fn
        self._target_s = target_latency_s
        self.batch_size = batch_size
        self._queue: deque[tuple[Doc, asyncio.Future[int]]] = deque()
        self._times: deque[float] = deque(maxlen=10)
        self._ready = asyncio.Event()
        self._stopping = False
        self._worker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._worker = asyncio.create_task(self._work())

    async def submit(self, record: Doc, estimated_cost: int | None = None) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((record, future))
        if len(self._queue) >= self.batch_size:
            self._ready.set()
        return future

    async def stop(self, timeout: float | None = None, *, cancel_pending: bool = False) -> None:
        self._stopping = True
        self._ready.set()
        if self._worker is not None:
            self._worker.cancel()
        for _, future in self._queue:
            future.cancel()

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while len(self._queue) < self.batch_size and not self._stopping:
                self._ready.clear()
                await self._ready.wait()
            batch = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
            started = loop.time()
            results = await self._process_fn([record for record, _ in batch])
            self._times.append(loop.time() - started)
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
            mean = sum(self._times) / len(self._times)
            if mean < 0.8 * self._target_s:
                self.batch_size += 1
            elif mean > 1.2 * self._target_s:
                self.batch_size = max(1, self.batch_size - 1)


def contenders(quick: bool) -> dict[str, Callable[[], Any]]:
    """Every batcher of the sweep, by name, as a function that builds a fresh one."""
    found: dict[str, Callable[[], Any]] = {
        "ours, latency_slo_s=0.25": lambda: ours.DynamicBatcher(device, latency_slo_s=SLO_S, grouping="by_cost"),
        "ours, latency_slo_s=0.25, fifo": lambda: ours.DynamicBatcher(device, latency_slo_s=SLO_S),
        "flyte.extras defaults": lambda: extras.DynamicBatcher(process_fn=device),
        "guide's AdaptiveBatcher": lambda: GuideAdaptiveBatcher(device, SLO_S),
    }
    for grouping in GROUPINGS:
        for size in STATIC_SIZES if not quick else (8, 32, 128):
            found[f"static {size}, {grouping}"] = lambda size=size, grouping=grouping: ours.DynamicBatcher(
                device, max_batch_size=size, grouping=grouping
            )
    return found


@dataclass
class Outcome:
    """One contender at one load: its p99, throughput, share within the target, and whether it warned of overload."""

    p99_s: float
    throughput: float
    met: float
    warned: bool = False
    batcher: Any = field(default=None, repr=False)


class OverloadWarnings(logging.Handler):
    """Counts the batcher's overload warnings (and keeps them out of the benchmark's output)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "more than the batcher can serve" in record.getMessage()


WARNINGS = OverloadWarnings()


async def serve(
    make: Callable[[], Any],
    rate: float,
    duration_s: float,
    warmup_s: float,
    drain_s: float,
    *,
    seed: int | None = None,
    from_submit: bool = False,
) -> Outcome:
    """Offer `rate` records per second for `duration_s` to a fresh batcher; its p99 and throughput.

    Latency counts from each record's scheduled arrival, or (`from_submit`) from its `submit` call.
    """
    loop = asyncio.get_running_loop()
    warned_before = WARNINGS.count
    schedule = poisson_arrivals(rate, duration_s, seed=int(rate) if seed is None else seed)
    batcher = make()
    await batcher.start()
    start = loop.time()
    ended: dict[int, float] = {}
    futures = []
    for index, (offset, doc) in enumerate(schedule):
        delay = start + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if from_submit:
            schedule[index] = (loop.time() - start, doc)
        future = await batcher.submit(doc, estimated_cost=doc.tokens)
        future.add_done_callback(lambda _, index=index: ended.setdefault(index, loop.time() - start))
        futures.append(future)
    await asyncio.wait(futures, timeout=max(start + duration_s + drain_s - loop.time(), 0.001))
    now = loop.time() - start
    measured = [(offset, ended.get(index)) for index, (offset, _) in enumerate(schedule) if offset >= warmup_s]
    latencies = sorted((now if done is None else done) - offset for offset, done in measured)
    completed = sum(1 for _, done in measured if done is not None and done <= duration_s)
    if isinstance(batcher, ours.DynamicBatcher):
        await batcher.stop(timeout=0, cancel_pending=True)
    elif CLOCK is not None:
        await batcher.stop()  # flyte.extras finishes what is left first: on the virtual clock, at once
    else:  # in real time that is the whole backlog: leave it to `asyncio.run`'s cancelling
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(batcher.stop(), 0.5)
    return Outcome(
        p99_s=latencies[min(len(latencies) - 1, math.ceil(QUANTILE * len(latencies)) - 1)],
        throughput=completed / (duration_s - warmup_s),
        met=sum(latency <= SLO_S for latency in latencies) / len(latencies),
        warned=WARNINGS.count > warned_before,
        batcher=batcher,
    )


def sweep(loads: list[int], duration_s: float, warmup_s: float, quick: bool) -> dict[str, dict[int, Outcome]]:
    """Every contender at every load."""
    results: dict[str, dict[int, Outcome]] = {}
    for name, make in contenders(quick).items():
        results[name] = {}
        for load in loads:
            results[name][load] = CLOCK.run(serve(make, load, duration_s, warmup_s, drain_s=2.0))
        best = max((load for load in loads if results[name][load].p99_s <= SLO_S), default=0)
        print(f"{name}: within {SLO_S * 1000:.0f} ms up to {best} records/s", flush=True)
    return results


def highest_within(outcomes: dict[int, Outcome]) -> int:
    """The highest load whose p99 met the target (0: none)."""
    return max((load for load, outcome in outcomes.items() if outcome.p99_s <= SLO_S), default=0)


def oracle(results: dict[str, dict[int, Outcome]], load: int) -> tuple[str, Outcome]:
    """The static configuration with the lowest p99 at `load`."""
    statics = {name: outcomes[load] for name, outcomes in results.items() if name.startswith("static")}
    name = min(statics, key=lambda name: statics[name].p99_s)
    return name, statics[name]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def per_load_rows(results: dict[str, dict[int, Outcome]], loads: list[int]) -> list[list[object]]:
    rows: list[list[object]] = []
    for load in loads:
        best_name, best = oracle(results, load)
        mine = results["ours, latency_slo_s=0.25"][load]
        flyte = results["flyte.extras defaults"][load]
        guide = results["guide's AdaptiveBatcher"][load]
        stats = mine.batcher.stats
        choice = stats.slo.choice if stats.slo else None
        rows.append(
            [
                load,
                ms(mine.p99_s),
                f"{mine.throughput:.0f}",
                f"{mine.met:.1%}",
                f"{ms(choice.batch_time_s) if choice else '-'} / {stats.avg_batch_size:.1f}",
                "yes" if mine.warned else "no",
                f"{ms(best.p99_s)} ({best_name.removeprefix('static ')})",
                f"{best.throughput:.0f}",
                ms(flyte.p99_s),
                f"{flyte.throughput:.0f}",
                ms(guide.p99_s),
                f"{guide.throughput:.0f}",
            ]
        )
    return rows


PER_LOAD_HEADERS = [
    "records/s offered",
    "ours p99 ms",
    "ours records/s",
    "ours met",
    "ours: batch time limit ms / mean batch",
    "ours warned of overload",
    "best static p99 ms (config)",
    "best static records/s",
    "flyte.extras p99 ms",
    "flyte.extras records/s",
    "guide p99 ms",
    "guide records/s",
]


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, quick=False, rounds=3)
    parser.add_argument("--clock", choices=("virtual", "real"), default="virtual", help="the device's clock")
    parser.add_argument("--loads", default=None, help="comma-separated records/s (default 50 to 600 by 50)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals per run")
    parser.add_argument("--warmup", type=float, default=None, help="seconds left out of the p99 (virtual: 3, real: 2)")
    return parser.parse_args()


def main() -> None:
    started = time.process_time()  # on the virtual clock, CPU seconds tell the run's cost
    args = parse_args()
    logger = logging.getLogger("flyteplugins_batcher")
    logger.addHandler(WARNINGS)  # counted per run, not printed
    logger.propagate = False
    if args.clock == "real":
        main_real(args)
        return
    loads = [int(load) for load in args.loads.split(",")] if args.loads else list(range(50, 601, 50))
    if args.quick and not args.loads:
        loads = [100, 200, 300, 400, 500]
    duration = args.duration or (12.0 if args.quick else 30.0)
    results = sweep(loads, duration, 3.0 if args.warmup is None else args.warmup, args.quick)
    print(f"\n### Highest load within a {SLO_S * 1000:.0f}-ms p99\n")
    print(
        markdown_table(
            ["batcher", "records/s"], [[name, highest_within(outcomes)] for name, outcomes in results.items()]
        )
    )
    print(f"\n### p99 and throughput at each load ({duration:.0f} simulated s per run)\n")
    print(markdown_table(PER_LOAD_HEADERS, per_load_rows(results, loads)))
    write_line_chart_data(args.chart_data, chart(results, loads, duration))
    print(f"\n({time.process_time() - started:.0f} CPU s)")


# -- the real clock ------------------------------------------------------------------------------------

REAL_CONTENDERS = (
    "ours, latency_slo_s=0.25",
    "static 8, by_cost",
    "static 16, by_cost",
    "static 32, by_cost",
    "static 64, by_cost",
    "flyte.extras defaults",
)
"""Who runs in real time: ours, the static configurations that are ever best on this device, flyte.extras."""


def real_sweep(loads: list[int], duration_s: float, warmup_s: float, rounds: int) -> dict[str, dict[int, Outcome]]:
    """Every real-clock contender at every load, `rounds` times in alternated order; the median of each figure."""
    makers = {name: make for name, make in contenders(quick=False).items() if name in REAL_CONTENDERS}
    runs: dict[tuple[str, int], list[Outcome]] = {}
    for number in range(rounds):
        for load in loads:
            for name in round_order(number + load // 50, list(makers)):  # each contender's neighbours change
                outcome = asyncio.run(serve(makers[name], load, duration_s, warmup_s, 2.0, from_submit=True))
                runs.setdefault((name, load), []).append(outcome)
                print(
                    f"round {number + 1}, {load}/s, {name}: p99 {ms(outcome.p99_s)} ms, {outcome.throughput:.0f}/s",
                    flush=True,
                )
    return {name: {load: median_outcome(runs[name, load]) for load in loads} for name in makers}


def median_outcome(runs: list[Outcome]) -> Outcome:
    """Each figure's median over `runs`; the batcher of the run with the median p99; warned if most runs were."""
    middle = sorted(runs, key=lambda run: run.p99_s)[len(runs) // 2]
    return Outcome(
        p99_s=statistics.median(run.p99_s for run in runs),
        throughput=statistics.median(run.throughput for run in runs),
        met=statistics.median(run.met for run in runs),
        warned=sum(run.warned for run in runs) * 2 > len(runs),
        batcher=middle.batcher,
    )


def real_rows(results: dict[str, dict[int, Outcome]], loads: list[int]) -> list[list[object]]:
    """At each load, every contender's median p99 / records served, and ours over the best static's throughput."""
    rows: list[list[object]] = []
    statics = [name for name in results if name.startswith("static")]
    for load in loads:
        mine = results["ours, latency_slo_s=0.25"][load]
        most = max(results[name][load].throughput for name in statics)
        cells = [f"{ms(outcome.p99_s)} / {outcome.throughput:.0f}" for outcome in (r[load] for r in results.values())]
        rows.append([load, *cells, f"{mine.throughput / most:.2f}", "yes" if mine.warned else "no"])
    return rows


def main_real(args: argparse.Namespace) -> None:
    """The sweep in real time (`--clock real`): medians of `--rounds` alternated runs."""
    loads = [int(load) for load in args.loads.split(",")] if args.loads else [200, 250, 300, 350, 400, 450, 500]
    if args.quick and not args.loads:
        loads = [250, 300, 400, 500]
    duration = args.duration or (6.0 if args.quick else 10.0)
    results = real_sweep(loads, duration, 2.0 if args.warmup is None else args.warmup, args.rounds)
    print(f"\n### Highest load within a {SLO_S * 1000:.0f}-ms p99 (real clock, medians of {args.rounds})\n")
    print(markdown_table(["batcher", "records/s"], [[name, highest_within(o)] for name, o in results.items()]))
    print(f"\n### p99 ms / records/s served at each load ({duration:.0f} s per run, medians of {args.rounds})\n")
    headers = ["records/s offered", *results, "ours / most served by a static", "ours warned of overload"]
    print(markdown_table(headers, real_rows(results, loads)))
    write_line_chart_data(args.chart_data, chart(results, loads, duration, clock="real"))


CHARTED = ("ours, latency_slo_s=0.25", "best static at each load", "static 8, by_cost", "static 32, by_cost")
CHARTED_TOO = ("static 128, fifo", "flyte.extras defaults", "guide's AdaptiveBatcher")


def chart(
    results: dict[str, dict[int, Outcome]], loads: list[int], duration: float, clock: str = "virtual"
) -> LineChartData:
    """p99 and throughput against the load offered, for ours, the oracle, a few static configurations and the others."""
    lines = {**results, "best static at each load": {load: oracle(results, load)[1] for load in loads}}
    shown = [name for name in (*CHARTED, *CHARTED_TOO) if name in lines]
    p99 = tuple((name, tuple((load, lines[name][load].p99_s * 1000) for load in loads)) for name in shown)
    served = tuple((name, tuple((load, lines[name][load].throughput) for load in loads)) for name in shown)
    return LineChartData(
        title=f"A {SLO_S * 1000:.0f}-ms p99 target against static knobs: p99 and throughput as the load grows",
        unit="simulated padding GPU (10 ms a batch + 10 µs a padded token), lognormal 8-512 tokens, Poisson arrivals",
        x_label="records/s offered",
        panels=(
            Panel("p99 latency, ms (log scale)", p99, log=True, threshold=SLO_S * 1000, threshold_label="target"),
            Panel("records/s served", served),
        ),
        note=f"{clock.capitalize()} clock, {duration:.0f} {'simulated ' if clock == 'virtual' else ''}s per run "
        f"(benchmarks/bench_slo.py --clock {clock}).",
    )


if __name__ == "__main__":
    main()
