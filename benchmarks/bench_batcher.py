"""Side-by-side benchmark: flyteplugins_batcher vs flyte.extras (and a bare asyncio pipeline).

Everything runs in one process on the same workloads, so the ratios mean something even on a
noisy machine. Run `python benchmarks/bench_batcher.py` (about a minute); `--quick` for a smoke run;
`--sections overhead` for the per-record overhead alone (`--rounds N`, default 9).

Workloads:
1. overhead: an echo process function and 8 producers, 60 000 records in batches of up to 256;
   microseconds per record against a bare `asyncio.Queue` + `Future` pipeline measured in the same
   run (and ours with priorities and deadlines on every record, and with a plain `def`). Every
   contender runs once a round, in alternating order; medians over the rounds, and each round's
   ratio to bare (its median, lowest and highest), on the wall clock and in CPU time.
2. pipeline (harsh and gentle): 16 producer streams that wait on IO and burn CPU on the event loop
   per record, feeding a simulated device whose batch takes a fixed + per-token time in a
   GIL-releasing sleep (like a CUDA call). flyte.extras is used as its docs show (the blocking
   device call inside `async def`); ours gets the plain function. Reports throughput, the busy
   fraction measured by the device itself, and `stats.utilization` beside it.
3. latency: open-loop Poisson arrivals at about 40% of device capacity; p50/p99 from each
   record's scheduled arrival to its result.
4. memory: tracemalloc over 100k records with a bounded queue: peak and what stays afterwards.
5. correctness: batches over the cost budget, and runs that finish with a small queue and a
   minimum batch size.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import random
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flyte import extras

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

import flyteplugins_batcher as ours
from benchmarks._charts import write_chart_data
from benchmarks._harness import benchmark_parser, round_order
from benchmarks._tables import markdown_table

# -- 1. per-record overhead -------------------------------------------------------------------------

OVERHEAD_SETTINGS = {
    "target_batch_cost": 256,
    "max_batch_size": 256,
    "batch_timeout_s": 0.001,
    "max_queue_size": 10_000,
}


async def echo(batch: list[int]) -> list[int]:
    return batch


def echo_sync(batch: list[int]) -> list[int]:
    return batch


async def bare_pipeline(records_per_producer: int, producers: int) -> float:
    """The floor: producers put (future, value) on an asyncio.Queue; one consumer takes up to 256 at a time."""
    queue: asyncio.Queue[tuple[asyncio.Future[int], int]] = asyncio.Queue(maxsize=10_000)
    loop = asyncio.get_running_loop()

    async def consumer() -> None:
        while True:
            items = [await queue.get()]
            while len(items) < 256 and not queue.empty():
                items.append(queue.get_nowait())
            results = await echo([value for _, value in items])
            for (future, _), result in zip(items, results, strict=True):
                future.set_result(result)

    async def producer() -> None:
        futures = []
        for record in range(records_per_producer):
            future = loop.create_future()
            await queue.put((future, record))
            futures.append(future)
        await asyncio.gather(*futures)

    consumer_task = asyncio.create_task(consumer())
    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    elapsed = time.perf_counter() - started
    consumer_task.cancel()
    return elapsed


async def batcher_pipeline(
    make_batcher: Callable[[], Any], records_per_producer: int, producers: int, priorities: bool = False
) -> float:
    async def producer(batcher: Any, index: int) -> None:
        if priorities:  # two levels, interleaved, and a generous deadline on every record
            futures = [
                await batcher.submit(record, estimated_cost=1, priority=record % 2, deadline_s=60.0)
                for record in range(records_per_producer)
            ]
        else:
            futures = [await batcher.submit(record, estimated_cost=1) for record in range(records_per_producer)]
        await asyncio.gather(*futures)

    async with make_batcher() as batcher:
        started = time.perf_counter()
        await asyncio.gather(*(producer(batcher, index) for index in range(producers)))
        return time.perf_counter() - started


OVERHEAD_CONTENDERS = (
    "bare asyncio.Queue + Future",
    "flyte.extras DynamicBatcher",
    "ours (async def process_fn)",
    "ours (async def, 2 priorities + deadlines)",
    "ours (plain def, worker thread)",
)


def overhead_contenders(per_producer: int, producers: int) -> dict[str, Callable[[], Awaitable[float]]]:
    """Each contender of section 1 as a run of `producers` x `per_producer` records, in `OVERHEAD_CONTENDERS` order."""
    runs: list[Callable[[], Awaitable[float]]] = [
        lambda: bare_pipeline(per_producer, producers),
        lambda: batcher_pipeline(
            lambda: extras.DynamicBatcher(process_fn=echo, **OVERHEAD_SETTINGS), per_producer, producers
        ),
        lambda: batcher_pipeline(lambda: ours.DynamicBatcher(echo, **OVERHEAD_SETTINGS), per_producer, producers),
        lambda: batcher_pipeline(
            lambda: ours.DynamicBatcher(echo, **OVERHEAD_SETTINGS), per_producer, producers, priorities=True
        ),
        lambda: batcher_pipeline(lambda: ours.DynamicBatcher(echo_sync, **OVERHEAD_SETTINGS), per_producer, producers),
    ]
    return dict(zip(OVERHEAD_CONTENDERS, runs, strict=True))


def bench_overhead(records: int, rounds: int) -> list[list[object]]:
    """Every contender once a round, in alternating order; medians over the rounds.

    A round's ratio to bare compares runs seconds apart, so drift in the machine's speed (other
    workers) cancels out in it; the median of those ratios is the figure the goal is read on,
    and the lowest and highest show the noise. Beside the wall clock, each run's CPU time (the
    whole process, worker threads included): on a shared machine a run that waits for a core is
    slower on the wall clock but not in CPU time, so its ratio is the steadier measure of the
    work a record costs (it leaves out time a worker thread waits for the loop, which the wall clock has).
    """
    producers = 8
    contenders = overhead_contenders(records // producers, producers)
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    for number in range(rounds):
        for name in round_order(number, list(contenders)):
            gc.collect()
            started = time.process_time()
            wall[name].append(asyncio.run(contenders[name]()))
            cpu[name].append(time.process_time() - started)
    bare = OVERHEAD_CONTENDERS[0]
    rows: list[list[object]] = []
    for name in contenders:
        ratios = sorted(run / floor for run, floor in zip(wall[name], wall[bare], strict=True))
        cpu_ratios = [run / floor for run, floor in zip(cpu[name], cpu[bare], strict=True)]
        rows.append(
            [
                name,
                1e6 * statistics.median(wall[name]) / records,
                statistics.median(ratios),
                f"{ratios[0]:.2f}-{ratios[-1]:.2f}",
                1e6 * statistics.median(cpu[name]) / records,
                statistics.median(cpu_ratios),
            ]
        )
    return rows


# -- simulated device -------------------------------------------------------------------------------


@dataclass
class Doc:
    """A record with a token count, like a tokenized prompt."""

    index: int
    tokens: int

    def estimate_tokens(self) -> int:
        return self.tokens


@dataclass
class SimulatedDevice:
    """A batch costs `fixed_s + per_token_s * tokens` in a GIL-releasing sleep, like a CUDA call."""

    fixed_s: float = 0.020
    per_token_s: float = 0.000_010
    intervals: list[tuple[float, float]] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, batch: list[Doc]) -> list[int]:
        started = time.perf_counter()
        tokens = sum(doc.tokens for doc in batch)
        time.sleep(self.fixed_s + self.per_token_s * tokens)
        finished = time.perf_counter()
        with self.lock:
            self.intervals.append((started, finished))
            self.batch_sizes.append(len(batch))
            self.batch_tokens.append(tokens)
        return [doc.index for doc in batch]

    def busy_seconds(self, start: float, end: float) -> float:
        """Union of busy intervals inside [start, end] (overlapping batches count once)."""
        busy, cursor = 0.0, start
        for begin, finish in sorted(self.intervals):
            begin, finish = max(begin, cursor), min(finish, end)
            if finish > begin:
                busy += finish - begin
                cursor = finish
        return busy

    def batch_durations(self) -> list[float]:
        return [finish - begin for begin, finish in self.intervals]


def blocking_as_flyte_docs_show(device: SimulatedDevice) -> Callable[[list[Doc]], Awaitable[list[int]]]:
    async def inference(batch: list[Doc]) -> list[int]:
        return device(batch)  # the flyte.extras vLLM example calls llm.generate like this

    return inference


def make_token_batcher(kind: str, device: SimulatedDevice, **settings: Any) -> Any:
    if kind == "flyte.extras":
        return extras.TokenBatcher(inference_fn=blocking_as_flyte_docs_show(device), **settings)
    return ours.TokenBatcher(inference_fn=device, **settings)


BATCH_SETTINGS = {"target_batch_tokens": 4_000, "max_batch_size": 256, "batch_timeout_s": 0.05}
"""Settings for the latency and correctness workloads."""


# -- 2. loader + device pipeline --------------------------------------------------------------------


def burn_cpu(seconds: float) -> None:
    """Preprocessing (tokenizing, decoding an image): holds the GIL, on the event loop."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


@dataclass(frozen=True)
class Pipeline:
    """A loader + device workload: producer streams feeding one device."""

    title: str
    streams: int
    records: int
    io_s: float  # per record, awaited (reading from storage)
    cpu_s: float  # per record, busy on the event loop (tokenizing)
    cost_range: tuple[int, int]
    device_fixed_s: float
    device_per_token_s: float
    settings: dict[str, Any]


PIPELINES = {
    "harsh": Pipeline(
        title="600 records of 40-250 tokens, 16 streams: 4 ms IO + 0.2 ms CPU per record; "
        "device 10 ms + 4 µs/token; budget 4096, batches of up to 64",
        streams=16,
        records=600,
        io_s=0.004,
        cpu_s=0.000_2,
        cost_range=(40, 250),
        device_fixed_s=0.010,
        device_per_token_s=0.000_004,
        settings={"target_batch_tokens": 4_096, "max_batch_size": 64, "batch_timeout_s": 0.05, "max_queue_size": 5_000},
    ),
    "gentle": Pipeline(
        title="1600 records of 50-150 tokens, 16 streams: 10 ms IO + 0.2 ms CPU per record; "
        "device 20 ms + 10 µs/token; budget 4000",
        streams=16,
        records=1_600,
        io_s=0.010,
        cpu_s=0.000_2,
        cost_range=(50, 150),
        device_fixed_s=0.020,
        device_per_token_s=0.000_010,
        settings={"target_batch_tokens": 4_000, "max_batch_size": 256, "batch_timeout_s": 0.05},
    ),
}


async def pipeline_run(kind: str, workload: Pipeline, seed: int) -> dict[str, float]:
    device = SimulatedDevice(fixed_s=workload.device_fixed_s, per_token_s=workload.device_per_token_s)
    rng = random.Random(seed)
    per_stream = workload.records // workload.streams
    low, high = workload.cost_range
    docs = [
        [Doc(s * per_stream + i, rng.randint(low, high)) for i in range(per_stream)] for s in range(workload.streams)
    ]

    async def stream(batcher: Any, my_docs: list[Doc]) -> list[int]:
        futures = []
        for doc in my_docs:
            await asyncio.sleep(workload.io_s)
            burn_cpu(workload.cpu_s)
            futures.append(await batcher.submit(doc))
        return list(await asyncio.gather(*futures))

    async with make_token_batcher(kind, device, **workload.settings) as batcher:
        started = time.perf_counter()
        results = await asyncio.gather(*(stream(batcher, my_docs) for my_docs in docs))
        finished = time.perf_counter()
        stats = batcher.stats
    assert results == [[doc.index for doc in my_docs] for my_docs in docs], "results reached the wrong producer"
    wall = finished - started
    return {
        "records_per_s": workload.records / wall,
        "of_floor": device_bound_floor_s(workload, docs) / wall,
        "device_busy": device.busy_seconds(started, finished) / wall,
        "stats_utilization": stats.utilization,
        "avg_batch": statistics.mean(device.batch_sizes),
        "wall_s": wall,
    }


def device_bound_floor_s(workload: Pipeline, docs: list[list[Doc]]) -> float:
    """The shortest possible wall time: the first record's IO, then the device busy with perfectly packed batches."""
    tokens = sum(doc.tokens for stream in docs for doc in stream)
    budget = workload.settings["target_batch_tokens"]
    batches = max(math.ceil(tokens / budget), math.ceil(workload.records / workload.settings["max_batch_size"]))
    return workload.io_s + batches * workload.device_fixed_s + tokens * workload.device_per_token_s


def bench_pipeline(workload: Pipeline, repeats: int) -> list[list[object]]:
    runs: dict[str, list[dict[str, float]]] = {"flyte.extras": [], "ours": []}
    for repeat in range(repeats):
        for kind in runs:
            runs[kind].append(asyncio.run(pipeline_run(kind, workload, seed=repeat)))
    medians = {
        kind: {key: statistics.median(run[key] for run in results) for key in results[0]}
        for kind, results in runs.items()
    }
    base = medians["flyte.extras"]["records_per_s"]
    return [
        [
            kind,
            m["records_per_s"],
            m["records_per_s"] / base,
            f"{m['of_floor']:.1%}",
            f"{m['device_busy']:.1%}",
            f"{m['stats_utilization']:.1%}",
            f"{abs(m['stats_utilization'] - m['device_busy']):.3f}",
            m["avg_batch"],
            m["wall_s"],
        ]
        for kind, m in medians.items()
    ]


# -- 3. latency under open-loop arrivals ------------------------------------------------------------


async def latency_run(kind: str, load: float, records: int, seed: int) -> dict[str, float]:
    device = SimulatedDevice()
    rng = random.Random(seed)
    capacity = BATCH_SETTINGS["target_batch_tokens"] / 100 / (device.fixed_s + device.per_token_s * 4_000)
    rate = load * capacity
    latencies: list[float] = []

    async with make_token_batcher(kind, device, **BATCH_SETTINGS) as batcher:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        scheduled = started
        pending = []
        for index in range(records):
            scheduled += rng.expovariate(rate)
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            future = await batcher.submit(Doc(index, rng.randint(50, 150)))
            arrival = scheduled
            future.add_done_callback(lambda _, arrival=arrival: latencies.append(time.perf_counter() - arrival))
            pending.append(future)
        await asyncio.gather(*pending)
        del loop
    latencies.sort()
    durations = sorted(device.batch_durations())
    return {
        "rate": rate,
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[int(len(latencies) * 0.99) - 1],
        "batch_p99": durations[int(len(durations) * 0.99) - 1],
        "avg_batch": statistics.mean(device.batch_sizes),
    }


def bench_latency(records: int) -> list[list[object]]:
    rows = []
    for kind in ("flyte.extras", "ours"):
        result = asyncio.run(latency_run(kind, load=0.4, records=records, seed=7))
        bound = BATCH_SETTINGS["batch_timeout_s"] + 2 * result["batch_p99"]
        verdict = "yes" if result["p99"] <= bound else "no"
        rows.append(
            [
                kind,
                result["rate"],
                1000 * result["p50"],
                1000 * result["p99"],
                1000 * bound,
                verdict,
                result["avg_batch"],
            ]
        )
    return rows


# -- 4. memory ---------------------------------------------------------------------------------------


async def memory_run(make_batcher: Callable[[], Any], records: int) -> tuple[int, int]:
    done = 0

    def count(_: asyncio.Future[Any]) -> None:
        nonlocal done
        done += 1

    async with make_batcher() as batcher:
        for record in range(2_000):  # warm up caches and buckets before measuring
            (await batcher.submit(record)).add_done_callback(count)
        while done < 2_000:
            await asyncio.sleep(0.001)
        gc.collect()
        tracemalloc.start()
        baseline = tracemalloc.take_snapshot()
        tracemalloc.reset_peak()
        base_current, _ = tracemalloc.get_traced_memory()
        for record in range(records):
            (await batcher.submit(record)).add_done_callback(count)
        while done < 2_000 + records:
            await asyncio.sleep(0.001)
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        retained = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(baseline, "filename"))
        tracemalloc.stop()
    del current
    return peak - base_current, retained


def bench_memory(records: int) -> list[list[object]]:
    rows = []
    for name, factory in (
        ("flyte.extras", lambda: extras.DynamicBatcher(process_fn=echo, max_queue_size=1_000)),
        ("ours", lambda: ours.DynamicBatcher(echo, max_queue_size=1_000)),
    ):
        peak, retained = asyncio.run(memory_run(factory, records))
        rows.append([name, records, peak // 1024, retained // 1024])
    return rows


# -- 5. correctness ----------------------------------------------------------------------------------


async def budget_run(kind: str) -> tuple[int, int]:
    device = SimulatedDevice(fixed_s=0.001, per_token_s=0.0)
    rng = random.Random(3)
    async with make_token_batcher(kind, device, target_batch_tokens=1_000, max_batch_size=256) as batcher:
        futures = [await batcher.submit(Doc(i, rng.randint(50, 150))) for i in range(8_000)]
        await asyncio.gather(*futures)
    return sum(tokens > 1_000 for tokens in device.batch_tokens), len(device.batch_tokens)


def small_queue_runs(kind: str, attempts: int, timeout_s: float) -> int:
    module = extras if kind == "flyte.extras" else ours

    async def closed_loop() -> None:
        async def producer(batcher: Any) -> None:
            for i in range(5):
                await (await batcher.submit(i))

        async with module.DynamicBatcher(
            process_fn=echo, max_queue_size=2, min_batch_size=8, batch_timeout_s=0.02
        ) as batcher:
            await asyncio.gather(*(producer(batcher) for _ in range(5)))

    finished = 0
    for _ in range(attempts):
        thread = threading.Thread(target=asyncio.run, args=(closed_loop(),), daemon=True)
        thread.start()
        thread.join(timeout_s)  # a deadlocked run is abandoned (daemon thread)
        finished += not thread.is_alive()
    return finished


def bench_correctness() -> list[list[object]]:
    rows = []
    for kind in ("flyte.extras", "ours"):
        over, batches = asyncio.run(budget_run(kind))
        rows.append([kind, f"{over} of {batches}", f"{small_queue_runs(kind, attempts=5, timeout_s=3.0)} of 5"])
    return rows


# -- main --------------------------------------------------------------------------------------------


SECTIONS = ("overhead", "pipeline", "latency", "memory", "correctness")
"""The sections by name, in the order they run (`--sections overhead` runs the per-record overhead alone)."""


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, quick=False, json=None, rounds=9)
    parser.add_argument(
        "--sections",
        type=lambda text: [name.strip() for name in text.split(",")],
        default=list(SECTIONS),
        help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (default: all)",
    )
    args = parser.parse_args()
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"no section {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return args


PIPELINE_HEADERS = [
    "batcher",
    "records/s",
    "x flyte.extras",
    "of the device-bound floor",
    "device busy (device's own clock)",
    "stats.utilization",
    "difference",
    "avg batch",
    "wall s",
]
LATENCY_HEADERS = [
    "batcher",
    "arrivals/s",
    "p50 ms",
    "p99 ms",
    "bound ms (timeout + 2 batch p99)",
    "p99 within bound",
    "avg batch",
]


OVERHEAD_TITLE = "Per-record overhead (60 000 records, 8 producers, echo process function, batches of 256)"
OVERHEAD_HEADERS = [
    "pipeline",
    "µs / record (median)",
    "x bare (median of rounds)",
    "x bare (lowest-highest)",
    "CPU µs / record",
    "CPU x bare",
]


def run_sections(args: argparse.Namespace) -> dict[str, tuple[list[str], list[list[object]]]]:
    """The chosen sections' tables, by title."""
    scale = 0.2 if args.quick else 1.0
    chosen = set(args.sections)
    sections: dict[str, tuple[list[str], list[list[object]]]] = {}
    if "overhead" in chosen:
        sections[OVERHEAD_TITLE] = (OVERHEAD_HEADERS, bench_overhead(records=int(60_000 * scale), rounds=args.rounds))
    if "pipeline" in chosen:
        for name, workload in PIPELINES.items():
            rows = bench_pipeline(workload, repeats=5 if name == "harsh" else 3)
            sections[f"Loader + device pipeline, {name}: {workload.title}"] = (PIPELINE_HEADERS, rows)
    if "latency" in chosen:
        sections["Latency, open-loop Poisson arrivals at 40% of device capacity"] = (
            LATENCY_HEADERS,
            bench_latency(records=int(2_000 * scale)),
        )
    if "memory" in chosen:
        sections["Memory (tracemalloc, max_queue_size=1000)"] = (
            ["batcher", "records", "peak KiB", "retained KiB"],
            bench_memory(records=int(100_000 * scale)),
        )
    if "correctness" in chosen:
        sections["Correctness (8000 records of 50-150 tokens, budget 1000; small-queue closed loop)"] = (
            ["batcher", "batches over budget", "small-queue runs finished"],
            bench_correctness(),
        )
    return sections


def main() -> None:
    args = parse_args()
    sections = run_sections(args)
    for title, (headers, rows) in sections.items():
        print(f"\n### {title}\n")
        print(markdown_table(headers, rows))
    if args.json:
        args.json.write_text(json.dumps({title: rows for title, (_, rows) in sections.items()}, indent=2, default=str))
    if OVERHEAD_TITLE in sections:
        records = int(60_000 * (0.2 if args.quick else 1.0))
        write_chart_data(
            args.chart_data,
            title=f"Per-record overhead: {records:,} records, 8 producers, async def echo, batches <= 256",
            unit=f"µs per record, lower is better (median of {args.rounds} rounds, the contenders taking turns)",
            rows=[(row[0], row[1]) for row in sections[OVERHEAD_TITLE][1]],
            note="All in one process (benchmarks/bench_batcher.py).",
        )


if __name__ == "__main__":
    main()
