"""On a real GPU: how busy the batcher keeps it while producers spend CPU time on every record.

A real model runs on the device: `--layers` Llama MLP blocks (bf16 on CUDA) over a batch's packed
tokens, each batch timed by CUDA events on the device itself. Sixteen producer streams prepare
records of 40-250 tokens on the event loop (`burn_cpu`: tokenizing, decoding, validating: work that
holds the GIL) and submit them. The CPU time per record is swept as a multiple of the device's own
time per record (measured first), from none to twice it. Three ways feed the device, taking turns:

1. serial: one loop prepares a batch's records, then runs the batch (a plain script, no overlap);
2. flyte.extras `TokenBatcher`, used as its docs show (the blocking model call inside `async def`);
3. ours: `flyteplugins_batcher.TokenBatcher(inference_fn=device)`, the plain `def` in a worker thread.

`--switch-intervals 0.1` adds ours with the interpreter's GIL switch interval set that short, and
"ours + preparation in 8 processes" prepares each record in a process pool instead of on the event
loop (the remedies docs/benchmarks/gpu.md measures). Each way reports records/s, the device's busy
share (CUDA-event time over wall time), NVML's own utilization (`DeviceMonitor`), and ours its
`stats.utilization`. The ceiling with perfect overlap is `min(1, device time / CPU time per record)`.

    python benchmarks/bench_gpu.py --switch-intervals 0.1 --chart-data docs/benchmarks/data/gpu.json  # a CUDA GPU
    python benchmarks/bench_gpu.py --quick               # a CPU smoke run of the script
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

import flyteplugins_batcher as ours
from benchmarks._harness import benchmark_parser
from benchmarks._line_charts import LineChartData, Panel, write_line_chart_data
from benchmarks._tables import markdown_table

SETTINGS = {"target_batch_tokens": 4_096, "max_batch_size": 64, "batch_timeout_s": 0.05, "max_queue_size": 5_000}
"""Both batchers' settings; the serial loop fills its batches to the same token budget."""
STREAMS = 16
PROCESSES = ProcessPoolExecutor(8, mp_context=multiprocessing.get_context("fork"))
"""Preparation off the event loop; forked before any CUDA work, and it never touches the device."""
VOCAB = 32_000


@dataclass(frozen=True)
class Record:
    """A prepared record: its token ids."""

    index: int
    ids: torch.Tensor

    def estimate_tokens(self) -> int:
        return len(self.ids)


@dataclass
class MlpDevice:
    """`layers` Llama MLP blocks over a batch's packed tokens; every batch timed on the device."""

    device: str
    hidden: int
    intermediate: int
    layers: int
    timings: list[tuple[Any, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        generator = torch.Generator(self.device).manual_seed(0)
        scale = self.hidden**-0.5

        def weight(rows: int, columns: int) -> torch.Tensor:
            return torch.randn(rows, columns, generator=generator, device=self.device, dtype=dtype) * scale

        self.embed = weight(VOCAB, self.hidden)
        self.blocks = [
            (weight(self.hidden, 2 * self.intermediate), weight(self.intermediate, self.hidden))
            for _ in range(self.layers)
        ]

    def __call__(self, batch: list[Record]) -> list[float]:
        lengths = [len(record.ids) for record in batch]
        ids = torch.cat([record.ids for record in batch]).to(self.device, non_blocking=True)
        segment = torch.repeat_interleave(torch.arange(len(batch)), torch.tensor(lengths)).to(self.device)
        start = self._mark()
        hidden = self.embed[ids]
        for up, down in self.blocks:
            gate, value = (hidden @ up).chunk(2, dim=-1)
            hidden = hidden + (torch.nn.functional.silu(gate) * value) @ down
        pooled = torch.zeros(len(batch), device=self.device).index_add_(0, segment, hidden.float().mean(-1))
        end = self._mark()
        result = pooled.cpu().tolist()  # waits for the device
        self.timings.append((start, end))
        return result

    def _mark(self) -> Any:
        if self.device != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def busy_s(self) -> float:
        """Seconds the device spent on the batches so far (one stream: they never overlap)."""
        if self.device != "cuda":
            return sum(end - start for start, end in self.timings)
        torch.cuda.synchronize()
        return sum(start.elapsed_time(end) for start, end in self.timings) / 1e3


def make_records(count: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    return [Record(index, torch.randint(0, VOCAB, (rng.randint(40, 250),))) for index in range(count)]


def burn_cpu(seconds: float) -> None:
    """A record's preparation: holds the GIL, on the event loop."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def token_batches(records: list[Record]) -> list[list[Record]]:
    """Records in order, cut where the next one would pass the token budget or the size cap."""
    batches: list[list[Record]] = [[]]
    tokens = 0
    for record in records:
        if batches[-1] and (
            tokens + len(record.ids) > SETTINGS["target_batch_tokens"] or len(batches[-1]) == SETTINGS["max_batch_size"]
        ):
            batches.append([])
            tokens = 0
        batches[-1].append(record)
        tokens += len(record.ids)
    return batches


def serial(device: MlpDevice, records: list[Record], cpu_s: float) -> tuple[list[float], dict[str, float]]:
    results: list[float] = []
    for batch in token_batches(records):
        for _ in batch:
            burn_cpu(cpu_s)
        results.extend(device(batch))
    return results, {}


def through_batcher(
    kind: str, device: MlpDevice, records: list[Record], cpu_s: float, pool: Executor | None = None
) -> tuple[list[float], dict[str, float]]:
    async def stream(batcher: Any, mine: list[Record]) -> list[tuple[int, float]]:
        futures = []
        for record in mine:
            if pool is None:
                await asyncio.sleep(0)
                burn_cpu(cpu_s)
            else:  # the preparation in another process: the event loop only waits for it
                await asyncio.get_running_loop().run_in_executor(pool, burn_cpu, cpu_s)
            futures.append(await batcher.submit(record))
        return list(zip((record.index for record in mine), await asyncio.gather(*futures), strict=True))

    async def main() -> tuple[list[float], dict[str, float]]:
        async with make_batcher(kind, device) as batcher:
            shares = [records[start::STREAMS] for start in range(STREAMS)]
            pairs = [pair for share in await asyncio.gather(*(stream(batcher, s) for s in shares)) for pair in share]
            extra = {"stats.utilization": batcher.stats.utilization} if kind == "ours" else {}
        return [value for _, value in sorted(pairs)], extra

    return asyncio.run(main())


def make_batcher(kind: str, device: MlpDevice) -> Any:
    if kind == "ours":
        return ours.TokenBatcher(inference_fn=device, **SETTINGS)
    from flyte import extras

    async def inference(batch: list[Record]) -> list[float]:
        return device(batch)  # as flyte.extras' docs show: the model call blocks the event loop

    return extras.TokenBatcher(inference_fn=inference, **SETTINGS)


WAYS: dict[str, Callable[[MlpDevice, list[Record], float], tuple[list[float], dict[str, float]]]] = {
    "serial": serial,
    "flyte.extras": lambda device, records, cpu_s: through_batcher("flyte.extras", device, records, cpu_s),
    "ours": lambda device, records, cpu_s: through_batcher("ours", device, records, cpu_s),
    "ours + preparation in 8 processes": lambda device, records, cpu_s: through_batcher(
        "ours", device, records, cpu_s, PROCESSES
    ),
}


def with_switch_interval(seconds: float) -> Callable[[MlpDevice, list[Record], float], Any]:
    """Ours with the interpreter's GIL switch interval set to `seconds` for the run (5 ms by default)."""

    def run(device: MlpDevice, records: list[Record], cpu_s: float) -> tuple[list[float], dict[str, float]]:
        before = sys.getswitchinterval()
        sys.setswitchinterval(seconds)
        try:
            return through_batcher("ours", device, records, cpu_s)
        finally:
            sys.setswitchinterval(before)

    return run


def measure(way: str, device: MlpDevice, records: list[Record], cpu_s: float, reference: list[float]) -> dict:
    """One run of one way: records/s, the device's busy share by its own clock and by NVML."""
    device.timings.clear()
    monitor = ours.DeviceMonitor(interval_s=0.02)
    monitor.start()
    started = time.perf_counter()
    results, extra = WAYS[way](device, records, cpu_s)
    wall = time.perf_counter() - started
    monitor.stop()
    if reference and max(abs(a - b) for a, b in zip(results, reference, strict=True)) > 1e-2 * max(map(abs, reference)):
        raise AssertionError(f"{way}: results differ from the serial run's")
    nvml = monitor.utilization()
    return {
        "records_per_s": len(records) / wall,
        "device_busy": device.busy_s() / wall,
        "nvml": nvml.mean if nvml.available else float("nan"),
        "batches": len(device.timings),
        **extra,
        "results": results,
    }


def device_s_per_record(device: MlpDevice, records: list[Record]) -> float:
    """The device's own time per record with full batches (after a warm-up)."""
    batches = token_batches(records)
    for batch in batches[:3]:
        device(batch)
    device.timings.clear()
    for batch in batches:
        device(batch)
    return device.busy_s() / len(records)


def sweep(device: MlpDevice, records: list[Record], ratios: list[float], rounds: int) -> tuple[float, list[dict]]:
    """The device's time per record, and a row per CPU-time ratio and way."""
    per_record = device_s_per_record(device, records)
    print(f"device: {per_record * 1e3:.3f} ms per record ({len(token_batches(records))} full batches)", flush=True)
    rows = []
    for ratio in ratios:
        cpu_s = ratio * per_record
        runs: dict[str, list[dict]] = {way: [] for way in WAYS}
        for _ in range(rounds):
            reference: list[float] = []
            for way in WAYS:
                runs[way].append(measure(way, device, records, cpu_s, reference))
                reference = reference or runs[way][-1]["results"]
        for way, results in runs.items():
            row = {key: statistics.median(r[key] for r in results) for key in results[0] if key != "results"}
            rows.append(
                {
                    "cpu_ms": cpu_s * 1e3,
                    "ratio": ratio,
                    "way": way,
                    "ceiling": min(1.0, 1 / ratio) if ratio else 1.0,
                    **row,
                }
            )
            rate, busy = row["records_per_s"], row["device_busy"]
            print(f"  cpu {cpu_s * 1e3:.3f} ms ({ratio}x) {way}: {rate:.0f} records/s, busy {busy:.1%}", flush=True)
    return per_record, rows


def share(value: float) -> str:
    """A utilization as a percentage, or "n/a" where no device could be asked (NVML on a CPU)."""
    return "n/a" if math.isnan(value) else f"{value:.0%}"


def table(rows: list[dict]) -> str:
    serial_rate = {row["ratio"]: row["records_per_s"] for row in rows if row["way"] == "serial"}
    return markdown_table(
        [
            "CPU / record",
            "CPU / device",
            "way",
            "records/s",
            "vs serial",
            "device busy",
            "ceiling",
            "NVML",
            "stats.utilization",
        ],
        [
            [
                f"{row['cpu_ms']:.3f} ms",
                f"{row['ratio']:.2f}x",
                row["way"],
                round(row["records_per_s"]),
                f"{row['records_per_s'] / serial_rate[row['ratio']]:.2f}x",
                f"{row['device_busy']:.1%}",
                f"{row['ceiling']:.0%}",
                share(row["nvml"]),
                f"{row['stats.utilization']:.1%}" if "stats.utilization" in row else "",
            ]
            for row in rows
        ],
    )


CHARTED = ("serial", "ours", "ours + GIL switch 0.1 ms", "ours + preparation in 8 processes")


def chart(rows: list[dict], name: str, args: argparse.Namespace, per_record_s: float) -> LineChartData:
    """Records/s and NVML's utilization against CPU time per record, for the ways run that are charted."""
    shown = [way for way in CHARTED if any(row["way"] == way for row in rows)]

    def series(key: str, scale: float) -> tuple:
        return tuple(
            (way, tuple((row["ratio"], row[key] * scale) for row in rows if row["way"] == way)) for way in shown
        )

    return LineChartData(
        title=f"A real model on one {name.removeprefix('NVIDIA ')}, records prepared on the event loop: "
        "the GIL decides, not the batcher",
        unit=f"{args.layers} Llama MLP blocks ({args.hidden}x{args.intermediate}, bf16) over {args.records:,} records "
        f"of 40-250 tokens, {STREAMS} producer streams",
        x_label="CPU time per record / device time per record",
        panels=(
            Panel("records/s", series("records_per_s", 1)),
            Panel("GPU utilization (NVML), %", series("nvml", 100)),
        ),
        note=f"The device alone serves {1 / per_record_s:,.0f} records/s ({per_record_s * 1e3:.3f} ms a record). "
        f"Median of {args.rounds} rounds (benchmarks/bench_gpu.py).",
    )


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, rounds=2, quick=False, json=None)
    parser.add_argument("--records", type=int, default=3_000)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4_096)
    parser.add_argument("--intermediate", type=int, default=14_336)
    parser.add_argument("--ratios", default="0,0.25,0.5,1,2", help="CPU time per record, as multiples of the device's")
    parser.add_argument("--switch-intervals", default="", help="ours again with these GIL switch intervals (ms)")
    parser.add_argument("--ways", default="", help="only these ways (comma-separated), serial first")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.ways:
        for way in set(WAYS) - set(args.ways.split(",")):
            del WAYS[way]
    for milliseconds in filter(None, args.switch_intervals.split(",")):
        WAYS[f"ours + GIL switch {milliseconds} ms"] = with_switch_interval(float(milliseconds) / 1e3)
    if args.quick:
        args.records, args.layers, args.hidden, args.intermediate, args.rounds = 300, 2, 256, 512, 1
    list(PROCESSES.map(burn_cpu, [0.0] * 8))  # start the workers now, before CUDA and the clock
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(
        f"{name}: {args.layers} MLP blocks {args.hidden}x{args.intermediate}, {args.records} records of 40-250 tokens"
    )
    device = MlpDevice(device, args.hidden, args.intermediate, args.layers)
    ratios = [float(value) for value in args.ratios.split(",")]
    per_record, rows = sweep(device, make_records(args.records, seed=0), ratios, args.rounds)
    print()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"device": name, "args": vars(args), "rows": rows}, indent=2, default=str))
    write_line_chart_data(args.chart_data, chart(rows, name, args, per_record))
    PROCESSES.shutdown()


if __name__ == "__main__":
    main()
