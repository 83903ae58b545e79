"""Does the simulated GPU give the same figures when its clock runs faster? (SimulatedEngine, no real GPU.)

The same job (every request submitted at once through the engine's `TokenBatcher`, stream mode)
runs on a fresh `SimulatedEngine` at each `--scales` value. A faithful clock gives the same engine
steps, occupancy and virtual makespan (wall time x scale) at every scale; the clock-free offline
run of the same requests (`engine.ideal_run`, vLLM's `generate(all)`) is the reference. Our own
per-record overhead (the batcher, the engine pipeline) is real time, so it weighs `scale` times
more on the virtual clock: the fastest clock is the harshest test.

Also measured: CPU per request, for the whole process (batcher + engine + device thread) and for
the device thread alone (what simulating the GPU costs), and `lag`: how far the device thread
ever fell behind its clock (near 0: the timings are faithful).

    python benchmarks/bench_sim_timescale.py                       # 2,000 requests at scales 1, 10, 30
    python benchmarks/bench_sim_timescale.py --requests 500 --scales 10,30 --long-fraction 0.05
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import benchmark_parser
from benchmarks._tables import markdown_table
from flyteplugins_batcher.engines import GenerationConfig
from flyteplugins_batcher.engines.simulated import OutputLengths, SimulatedEngine

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
    "matches",
]


def synthetic_prompts(count: int, min_chars: int = 80, max_chars: int = 1200) -> list[str]:
    """`count` distinct prompts of varied, reproducible lengths (about 20 to 300 simulated tokens)."""
    prompts = []
    for index in range(count):
        length = min_chars + (index * 7919) % (max_chars - min_chars)
        words = " ".join(_WORDS[(index + position) % len(_WORDS)] for position in range(length // 5 + 1))
        prompts.append(f"Request {index}: {words}"[:length])
    return prompts


@dataclass
class ScaleRun:
    """One job at one time scale."""

    scale: str
    steps: int
    occupancy: float
    virtual_makespan_s: float
    busy_virtual_s: float
    wall_s: float
    cpu_us_per_request: float
    device_cpu_us_per_request: float
    lag_ms: float


async def run_job(engine: SimulatedEngine, prompts: list[str]) -> tuple[float, float]:
    """Every prompt at once through the engine's batcher; (wall seconds, process CPU seconds)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    async with engine.batcher() as batcher:
        results = await batcher.run(prompts, return_exceptions=True)
    failed = [result for result in results if isinstance(result, BaseException)]
    if failed:
        raise SystemExit(f"bench_sim_timescale: {len(failed)} requests failed, first: {failed[0]!r}")
    return time.perf_counter() - started, time.process_time() - cpu_started


def measure(scale: float, prompts: list[str], lengths: OutputLengths, max_new_tokens: int) -> ScaleRun:
    engine = SimulatedEngine(
        time_scale=scale, output_lengths=lengths, generation=GenerationConfig(max_new_tokens=max_new_tokens)
    )
    with engine:
        wall_s, cpu_s = asyncio.run(run_job(engine, prompts))
        stats, gpu_thread_cpu_s, lag_s = engine.stats, engine.gpu_thread_cpu_s, engine.lag_s
    return ScaleRun(
        scale=f"{scale:g}x",
        steps=stats.steps,
        occupancy=stats.occupancy,
        virtual_makespan_s=wall_s * scale,
        busy_virtual_s=stats.step_time_s,
        wall_s=wall_s,
        cpu_us_per_request=cpu_s / len(prompts) * 1e6,
        device_cpu_us_per_request=gpu_thread_cpu_s / len(prompts) * 1e6,
        lag_ms=lag_s * 1e3,
    )


def ideal(prompts: list[str], lengths: OutputLengths, max_new_tokens: int) -> ScaleRun:
    engine = SimulatedEngine(output_lengths=lengths, generation=GenerationConfig(max_new_tokens=max_new_tokens))
    with engine:
        run = engine.ideal_run(prompts)
    return ScaleRun("offline ideal", run.steps, run.occupancy, run.makespan_s, run.makespan_s, 0.0, 0.0, 0.0, 0.0)


def table(runs: list[ScaleRun]) -> str:
    reference = runs[0]
    headers = [
        "clock",
        "steps",
        "steps / ideal",
        "occupancy",
        "virtual makespan s",
        "makespan / ideal",
        "busy (virtual) s",
        "wall s",
        "CPU us/request",
        "device thread CPU us/request",
        "max lag ms",
    ]
    rows = [
        [
            run.scale,
            run.steps,
            run.steps / reference.steps,
            run.occupancy,
            run.virtual_makespan_s,
            run.virtual_makespan_s / reference.virtual_makespan_s,
            run.busy_virtual_s,
            run.wall_s,
            run.cpu_us_per_request,
            run.device_cpu_us_per_request,
            run.lag_ms,
        ]
        for run in runs
    ]
    return markdown_table(headers, rows)


def main() -> None:
    parser = benchmark_parser(__doc__, json=None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--scales", default="1,10,30", help="time scales to compare, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--mean-output", type=int, default=200, help="mean output tokens of the ordinary requests")
    parser.add_argument("--long-fraction", type=float, default=0.0, help="share of 2,000-token outputs")
    args = parser.parse_args()

    lengths = OutputLengths(mean=args.mean_output, long_fraction=args.long_fraction, long_tokens=2000)
    prompts = synthetic_prompts(args.requests)
    runs = [ideal(prompts, lengths, args.max_new_tokens)]
    for scale in (float(value) for value in args.scales.split(",")):
        runs.append(measure(scale, prompts, lengths, args.max_new_tokens))
        print(f"scale {scale:g}: {runs[-1].wall_s:.1f} s wall", file=sys.stderr)

    print(f"Simulated, not measured on a GPU. Engine model: {SimulatedEngine().gpu.describe()}.")
    print(
        f"{args.requests:,} requests at once through the stream-mode TokenBatcher; outputs {lengths}, "
        f"max_new_tokens={args.max_new_tokens}. Virtual makespan = wall x scale.\n"
    )
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(run) for run in runs]}, indent=2))
    write_chart_data(
        args.chart_data,
        title=f"The simulated engine at faster clocks: {args.requests:,} requests at once",
        unit="makespan / the offline ideal's, 1.00 is the ideal",
        rows=[(run.scale, run.virtual_makespan_s / runs[0].virtual_makespan_s) for run in runs],
        note="Simulated, not measured on a GPU; engine steps per clock: "
        f"{' / '.join(f'{run.steps:,}' for run in runs[1:])} (benchmarks/bench_sim_timescale.py).",
    )


if __name__ == "__main__":
    main()
