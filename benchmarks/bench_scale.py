"""Scale, measured the way a GPU cluster behaves: the real driver, R replica processes, a GPU-timed engine.

The real JSONL job (`flyteplugins_batcher/jobs/_jsonl/job.py`'s chunks through
`flyteplugins_batcher/jobs/_driver.py`'s `fan_out`, results written to `results.jsonl`) runs against R
replica processes (spawned), each running the real replica code path
(`LLMReplica.run_chunk`, `flyteplugins_batcher.replica`: the shared batcher, the engine's
`TokenBatcher` settings, stream mode) around `SimulatedEngine`: vLLM's continuous batching with an
H100's step times, sleeping instead of computing. A router in the driver queues calls as Flyte
does (FIFO; a call goes to any replica with one of its `concurrency` slots free) with a one-way
call latency (`--latency`, virtual seconds each way), and retries the calls of a replica that died.

Measured for each R (`--replicas`, 20,000 requests each by default):
- occupancy while work remains: running sequences per engine step over `max_num_seqs`, times the
  share of time the engine had work, from the start until the first replica ran out of work;
- makespan over the ideal: each replica running its even share as one `generate(all)` on the same
  engine model, all requests known up front, no clock (`SimulatedEngine.ideal_run`);
- requests/s (virtual), and scaling: requests/s at the largest R over R = 1;
- the tail: from the first replica that ran out of work to the end of the job.
Then the same job with 5% long outputs (2,000 tokens, `max_tokens` 2,048), and one with a replica
process killed (SIGKILL) halfway: every `custom_id` must be in `results.jsonl` exactly once, and
the makespan must grow by no more than the lost replica's work (bound printed).

Time runs faster than real time (`--time-scale`; "auto" picks, per run, the scale at which the
job at ideal speed runs at `--target-rate` requests per wall second, so our CPU use stays the same
at every R). Our own overhead (driver, batcher, pipes) is real time and weighs `scale` times more
on the virtual clock: a faster clock is the harsher test. `--scale-check` shows, on a small job
at R=2, that time scale 1 gives the same figures as the scale used.

    python benchmarks/bench_scale.py                            # the defaults (size_in_flight), R = 1, 2, 4, 8
    python benchmarks/bench_scale.py --defaults before          # the defaults before issue 15, for comparison
    python benchmarks/bench_scale.py --engine vllm --model Qwen/Qwen2.5-7B-Instruct   # a GPU: one replica, real vLLM
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks import scale_report
from benchmarks._charts import write_chart_data
from benchmarks._harness import SHARED_GSM8K, benchmark_parser
from benchmarks.scale_harness import (
    JobRun,
    ReplicaProcess,
    engine_requests,
    questions_from,
    run_job,
    start_fleet,
    warm_up,
    write_requests,
)
from flyteplugins_batcher import InFlight, size_in_flight
from flyteplugins_batcher.engines.simulated import (
    OutputLengths,
    SimulatedEngine,
    SimulatedGpu,
)
from flyteplugins_batcher.replica import EngineSettings

BEFORE = InFlight(chunk_size=32, concurrency=10, chunks_in_flight=16, requests_per_replica=320)
"""Before issue 15: workflows/batch_jsonl.py's chunk_size 32 and max_chunks_in_flight 16 (over all replicas),
BATCH_LLM_CONCURRENCY 10 (batch_llm.py had 8 / 64; this harness drives the JSONL job)."""


@dataclass(frozen=True)
class Job:
    """One kind of job: its outputs, its `max_tokens`, its size."""

    name: str
    requests: int
    max_tokens: int
    lengths: OutputLengths


@dataclass
class Measured:
    """One run's figures (seconds are virtual: wall x scale)."""

    label: str
    replicas: int
    requests: int
    time_scale: float
    chunk_size: int
    concurrency: int
    chunks_in_flight: int
    ideal_s: float
    ideal_occupancy: float
    makespan_s: float
    occupancy: float
    step_occupancy: float
    busy: float
    run_occupancy: float
    requests_per_s: float
    tail_s: float
    lost: int
    duplicated: int
    errors: int
    retried: int
    max_lag_ms: float
    cores: float
    kill: dict[str, float] | None = None

    @property
    def makespan_x_ideal(self) -> float:
        return self.makespan_s / self.ideal_s


# -- what each run measures ------------------------------------------------------------------------


def gpu_from(args: argparse.Namespace) -> SimulatedGpu:
    return SimulatedGpu(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)


def settings_for(job: Job, args: argparse.Namespace, scale: float) -> EngineSettings:
    if args.engine == "vllm":
        return EngineSettings(
            engine="vllm", model=args.model, engine_args=args.engine_args, max_new_tokens=job.max_tokens
        )
    options = {"time_scale": scale, "gpu": asdict(gpu_from(args)), "output_lengths": asdict(job.lengths)}
    return EngineSettings(engine="simulated", engine_args=json.dumps(options), max_new_tokens=job.max_tokens)


def ideal_run(path: Path, job: Job, replicas: int, args: argparse.Namespace) -> tuple[float, float]:
    """Each replica's even share as one `generate(all)`: the slowest share's makespan (virtual s), and occupancy."""
    engine = SimulatedEngine(gpu=gpu_from(args), output_lengths=job.lengths)
    with engine:
        requests = engine_requests(path, settings_for(job, args, 1.0))
        shares = [engine.ideal_run(requests[share::replicas]) for share in range(replicas)]
    running = sum(share.running_seqs for share in shares)
    return max(share.makespan_s for share in shares), running / sum(
        share.steps * share.max_num_seqs for share in shares
    )


def time_scale(ideal: float, requests: int, args: argparse.Namespace) -> float:
    """`--time-scale`, or (auto) the scale at which the job at ideal speed runs `--target-rate` requests/s."""
    if args.engine == "vllm":
        return 1.0
    if args.time_scale != "auto":
        return float(args.time_scale)
    return round(min(max(args.target_rate * ideal / requests, 1.0), args.max_scale), 1)


async def measure(
    fleet: list[ReplicaProcess], job: Job, replicas: int, args: argparse.Namespace, *, kill_at: float | None = None
) -> Measured:
    """Run `job` on the first `replicas` of the fleet with the chosen defaults, and measure it."""
    folder = Path(tempfile.mkdtemp(prefix=f"bench-scale-{job.name}-r{replicas}-"))
    path = write_requests(
        folder / "requests.jsonl", job.requests, questions_from(args.questions), max_tokens=job.max_tokens
    )
    ideal, ideal_occupancy = ideal_run(path, job, replicas, args) if args.engine == "simulated" else (0.0, 0.0)
    scale = time_scale(ideal, job.requests, args)
    settings = settings_for(job, args, scale)
    used = fleet[:replicas]
    baseline = await warm_up(used, settings)
    sized = sizing(args, max(state.max_num_seqs for state in baseline.values()), replicas)
    cpu = await probe(used)
    run = await run_job(
        path,
        folder,
        used,
        settings,
        baseline=baseline,
        chunk_size=sized.chunk_size,
        concurrency=sized.concurrency,
        chunks_in_flight=sized.chunks_in_flight,
        latency_s=args.latency / scale,
        kill_at=kill_at,
    )
    after = await probe([replica for replica in used if replica.alive])
    used_cpu = sum(after[index]["cpu_s"] - cpu[index]["cpu_s"] for index in after) + run.driver_cpu_s
    lag = max(probe["lag_s"] for probe in after.values())
    if args.engine == "vllm":  # after the run, so that both find the engine warm
        final = max((state for _, state in run.snapshots[0]), key=lambda state: state.records)
        ideal, ideal_occupancy = await scale_report.vllm_ideal(used[0], path, settings, final)
    return figures(run, job, sized, scale, (ideal, ideal_occupancy), used_cpu / run.wall_s, lag)


def sizing(args: argparse.Namespace, max_num_seqs: int, replicas: int) -> InFlight:
    """The in-flight work a run uses: the defaults before issue 15, or `size_in_flight`'s (`--chunk-size` aside)."""
    if args.defaults == "before":
        return BEFORE
    return size_in_flight(max_num_seqs, replicas, chunk_size=args.chunk_size)


async def probe(replicas: list[ReplicaProcess]) -> dict[int, dict[str, float]]:
    answers = await asyncio.gather(*(replica.call("probe", None) for replica in replicas))
    return {replica.index: answer for replica, answer in zip(replicas, answers, strict=True)}


def figures(
    run: JobRun, job: Job, sized: InFlight, scale: float, ideal: tuple[float, float], cores: float, lag: float
) -> Measured:
    """The run's figures, in virtual seconds; `ideal`: the offline ideal's makespan and occupancy."""
    window = scale_report.work_window(run)
    expected = {f"req-{number:06d}" for number in range(job.requests)}
    kill = None
    if run.kill is not None:
        kill = {"replica": run.kill.replica, "at_s": run.kill.at_s * scale, "requests_lost": run.kill.requests_lost}
    return Measured(
        label=job.name,
        replicas=len(run.baseline),
        requests=job.requests,
        time_scale=scale,
        chunk_size=sized.chunk_size,
        concurrency=sized.concurrency,
        chunks_in_flight=sized.chunks_in_flight,
        ideal_s=ideal[0],
        ideal_occupancy=ideal[1],
        makespan_s=run.wall_s * scale,
        occupancy=window.occupancy,
        step_occupancy=window.step_occupancy,
        busy=window.busy,
        run_occupancy=window.run_occupancy,
        requests_per_s=job.requests / (run.wall_s * scale),
        tail_s=window.tail_s * scale,
        lost=len(expected - set(run.results)),
        duplicated=len(run.results) - len(set(run.results)),
        errors=run.errors,
        retried=run.retried,
        max_lag_ms=lag * 1e3,
        cores=cores,
        kill=kill,
    )


# -- the whole benchmark ---------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> dict[str, object]:
    base = Job("base", args.requests, args.max_tokens, OutputLengths(mean=200, spread=0.5))
    long = Job("5% long", args.requests, 2048, OutputLengths(mean=200, spread=0.5, long_fraction=0.05))
    planned = [(base, int(count), None) for count in args.replicas.split(",")] if "base" in args.runs else []
    if args.engine == "simulated":
        planned += [(long, args.long_replicas, None)] if "long" in args.runs else []
        planned += [(base, args.kill_replicas, 0.5)] if "kill" in args.runs else []
    fleet = start_fleet(max([count for _, count, _ in planned] + [2 if args.scale_check else 1]))
    for replica in fleet:
        replica.listen()
    runs: list[Measured] = []
    try:
        if args.scale_check:
            await scale_report.scale_check(fleet, base, args, measure)
        for job, count, kill_at in planned:
            runs.append(await measure(fleet, job, count, args, kill_at=kill_at))
            print(scale_report.progress_line(runs[-1]), file=sys.stderr, flush=True)
    finally:
        for replica in fleet:
            replica.stop()
    return scale_report.summary(runs, args) if runs else {}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, json=None, max_num_seqs=SimulatedGpu.max_num_seqs)
    parser.add_argument("--replicas", default="1,2,4,8", help="replica counts to measure, comma-separated")
    parser.add_argument("--requests", type=int, default=20_000, help="requests per job")
    parser.add_argument("--max-tokens", type=int, default=512, help="each request's max_tokens (the long run: 2048)")
    parser.add_argument("--defaults", choices=("after", "before"), default="after", help="size_in_flight, or before it")
    parser.add_argument("--latency", type=float, default=0.5, help="one-way call latency, virtual seconds")
    parser.add_argument("--time-scale", default="auto", help='"auto", or how much faster than real time')
    parser.add_argument("--target-rate", type=float, default=300.0, help="auto: wall requests/s at ideal speed")
    parser.add_argument("--max-scale", type=float, default=16.0, help="auto: the fastest clock")
    parser.add_argument("--long-replicas", type=int, default=8, help="replicas of the 5%% long outputs run")
    parser.add_argument("--kill-replicas", type=int, default=8, help="replicas of the run that loses one")
    parser.add_argument("--runs", default="base,long,kill", help="which runs: base (each R), long, kill")
    parser.add_argument("--chunk-size", type=int, default=None, help="override the rule's chunk size")
    parser.add_argument("--scale-check", action="store_true", help="first compare time scale 1 with auto at R=2")
    parser.add_argument("--scale-check-requests", type=int, default=8000, help="the scale check's job size")
    parser.add_argument("--max-num-batched-tokens", type=int, default=SimulatedGpu.max_num_batched_tokens)
    parser.add_argument("--questions", type=Path, default=SHARED_GSM8K, help="gsm8k-style JSONL (else synthetic)")
    parser.add_argument("--engine", choices=("simulated", "vllm"), default="simulated")
    parser.add_argument("--model", default="", help="vllm: the model (a hub id or path)")
    parser.add_argument("--engine-args", default="", help="vllm: engine arguments as a JSON object")
    args = parser.parse_args(argv)
    if args.engine == "vllm":
        args.replicas = "1"
    return args


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    summary = asyncio.run(bench(args))
    if summary:
        print(scale_report.render(summary, args))
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    simulated = args.engine == "simulated"
    write_chart_data(
        args.chart_data,
        title=f"{args.requests:,} gsm8k requests on {args.replicas.replace(',', ', ')} replicas, "
        + ("with size_in_flight's defaults" if args.defaults == "after" else "with the defaults before size_in_flight"),
        unit=f"requests/s{' on the virtual clock' if simulated else ''}, higher is better",
        rows=chart_rows(summary),
        note=f"{'Simulated, not measured on a GPU: ' if simulated else 'Measured with '}{summary.get('engine', '')} "
        "(benchmarks/bench_scale.py).",
        digits=1,
    )


def chart_rows(summary: dict[str, Any]) -> list[tuple[str, float]]:
    """The chart's rows: each base run's requests/s by replica count, then the long-output and replica-loss runs'."""
    rows = [(f"R={run['replicas']}", run["requests_per_s"]) for run in summary.get("runs", [])]
    for key, name in (("long_outputs", "5% long outputs"), ("replica_killed", "one replica killed")):
        run = summary.get(key)
        if isinstance(run, dict):
            rows.append((f"R={run['replicas']}, {name}", run["requests_per_s"]))
    return rows


if __name__ == "__main__":
    main()
