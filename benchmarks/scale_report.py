"""bench_scale's figures: the window while work remains, the replica-loss bound, the goals, the table and the JSON."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks._tables import markdown_table
from benchmarks.scale_harness import JobRun, ReplicaProcess, request_items
from flyteplugins_batcher.engines.simulated import SimulatedGpu
from flyteplugins_batcher.replica import EngineSettings, RequestChunk

GOALS = {"occupancy": 0.95, "makespan_x_ideal": 1.05, "scaling": 7.6, "long_makespan_x_ideal": 1.10}


@dataclass(frozen=True)
class Window:
    """How full the engines were, from the states the chunks brought back.

    Attributes:
        step_occupancy: Running sequences per engine step over `max_num_seqs`, across the replicas,
            while work remained: from the start until the last call left the driver (after that, no
            request waits anywhere but in the replicas, and they drain, as the ideal does at its end).
        busy: Share of that window the engines had work (at least one request in them).
        occupancy: Both together: each replica's step occupancy times its busy share, averaged.
        run_occupancy: Step occupancy over the whole run, drain included (compare with the ideal's).
        tail_s: Wall seconds from the first replica running out of work (its last chunk done) to the end.
    """

    step_occupancy: float
    busy: float
    occupancy: float
    run_occupancy: float
    tail_s: float


def work_window(run: JobRun) -> Window:
    """The engines' occupancy while work remained and over the whole run, and the tail."""
    killed = run.kill.replica if run.kill is not None else None
    worked = {index: states for index, states in run.snapshots.items() if states and index != killed}
    tail_start = min(max(at for at, _ in states) for states in worked.values())
    step_occupancy, busy, occupancy = _occupancy(run, worked, until=run.last_dispatch)
    run_occupancy, _, _ = _occupancy(run, worked, until=float("inf"))
    return Window(step_occupancy, busy, occupancy, run_occupancy, run.started + run.wall_s - tail_start)


def _occupancy(run: JobRun, worked: dict[int, list[tuple[float, Any]]], until: float) -> tuple[float, float, float]:
    """(step occupancy, busy share, both) of the replicas from their baseline to their last state before `until`."""
    running = capacity = 0
    busy_s = window_s = weighted = 0.0
    for index, states in worked.items():
        reached = [(at, state) for at, state in states if at <= until] or states[:1]
        at, last = max(reached, key=lambda item: item[1].records)
        counts = last.engine_counts().since(run.baseline[index].engine_counts())
        span = at - run.started
        running += counts.running_seqs
        capacity += counts.steps * counts.max_num_seqs
        busy_s += min(counts.generate_time_s, span)
        window_s += span
        weighted += counts.occupancy * min(counts.generate_time_s, span)
    if not window_s or not capacity:
        return 0.0, 0.0, 0.0
    return running / capacity, busy_s / window_s, weighted / window_s


def kill_bound(killed: Any, reference: Any) -> dict[str, float]:
    """How much the makespan may grow when one of R replicas dies at `t_k` holding W requests.

    Without the kill the job took `M` (the reference run, same R). The R-1 others take over the
    dead replica's share of the rest, `(M - t_k) / (R - 1)`, and redo its W lost requests at the
    per-replica rate `r = N / (R x M)`: `W / ((R - 1) x r)`. Bound: `M` plus both.
    """
    replicas, makespan = reference.replicas, reference.makespan_s
    at_s, lost = killed.kill["at_s"], killed.kill["requests_lost"]
    rate = reference.requests / (replicas * makespan)
    share = (makespan - at_s) / (replicas - 1)
    redo = lost / ((replicas - 1) * rate)
    return {
        "reference_makespan_s": makespan,
        "killed_at_s": at_s,
        "requests_lost": lost,
        "share_of_rest_s": share,
        "redo_lost_s": redo,
        "bound_s": makespan + share + redo,
        "growth_s": killed.makespan_s - makespan,
        "allowed_growth_s": share + redo,
    }


def summary(runs: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON `--json` writes: every run, the long-output run, the replica loss, the defaults, the goals."""
    base = [run for run in runs if run.label == "base" and run.kill is None]
    long = next((run for run in runs if run.label == "5% long"), None)
    killed = next((run for run in runs if run.kill is not None), None)
    reference = next((run for run in base if killed is not None and run.replicas == killed.replicas), None)
    result: dict[str, Any] = {
        "engine": describe_engine(args),
        "defaults_mode": args.defaults,
        "latency_s": args.latency,
        "runs": [run_json(run) for run in base],
        "defaults": {
            "chunk_size": runs[0].chunk_size,
            "concurrency": runs[0].concurrency,
            "chunks_in_flight": runs[0].chunks_in_flight,
            "chunks_in_flight_by_replicas": {str(run.replicas): run.chunks_in_flight for run in runs},
        },
    }
    by_replicas = {run.replicas: run for run in base}
    if 1 in by_replicas and len(by_replicas) > 1:
        largest = max(by_replicas)
        result["scaling"] = {
            "replicas": largest,
            "x": by_replicas[largest].requests_per_s / by_replicas[1].requests_per_s,
        }
    if long is not None:
        result["long_outputs"] = run_json(long)
    if killed is not None:
        result["replica_killed"] = {**run_json(killed), "lost": killed.lost, "duplicated": killed.duplicated}
        if reference is not None:
            result["replica_killed"]["bound"] = kill_bound(killed, reference)
    result["goals"] = goals(result)
    return result


def run_json(run: Any) -> dict[str, Any]:
    keys = ("replicas", "requests", "occupancy", "makespan_x_ideal", "requests_per_s", "tail_s")
    extras = ("time_scale", "ideal_s", "makespan_s", "step_occupancy", "busy", "run_occupancy", "ideal_occupancy")
    extras += ("chunk_size", "concurrency")
    extras += ("chunks_in_flight", "lost", "duplicated", "errors", "retried", "max_lag_ms", "cores")
    return {key: getattr(run, key) for key in keys + extras}


def goals(result: dict[str, Any]) -> list[tuple[str, bool]]:
    """Each goal of issue 15, and whether this run met it."""
    checks = [
        (
            f"occupancy >= {GOALS['occupancy']} at every R",
            all(r["occupancy"] >= GOALS["occupancy"] for r in result["runs"]),
        ),
        (
            f"makespan <= {GOALS['makespan_x_ideal']}x ideal at every R",
            all(r["makespan_x_ideal"] <= GOALS["makespan_x_ideal"] for r in result["runs"]),
        ),
    ]
    if "scaling" in result:
        scaling = result["scaling"]
        checks.append(
            (f"requests/s at R={scaling['replicas']} >= {GOALS['scaling']}x R=1", scaling["x"] >= GOALS["scaling"])
        )
    if "long_outputs" in result:
        long = result["long_outputs"]["makespan_x_ideal"]
        checks.append((f"5% long outputs: makespan <= {GOALS['long_makespan_x_ideal']}x ideal", long <= 1.10))
    if "replica_killed" in result:
        killed = result["replica_killed"]
        bound = killed.get("bound")
        within = bound is not None and bound["growth_s"] <= bound["allowed_growth_s"]
        checks.append(("replica killed: nothing lost or duplicated", killed["lost"] == killed["duplicated"] == 0))
        checks.append(("replica killed: makespan growth within the lost replica's work", within))
    return checks


def describe_engine(args: argparse.Namespace) -> str:
    if args.engine == "vllm":
        return f"real vLLM (stream mode), model {args.model or 'the bundled SmolLM2-135M-Instruct'}"
    gpu = SimulatedGpu(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    return f"SimulatedEngine, {gpu.describe()}"


def progress_line(run: Any) -> str:
    return (
        f"{run.label} R={run.replicas}: makespan {run.makespan_x_ideal:.3f}x ideal, occupancy {run.occupancy:.3f}, "
        f"scale {run.time_scale:g}, {run.cores:.2f} cores, lag {run.max_lag_ms:.0f} ms"
    )


# -- printing --------------------------------------------------------------------------------------


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    """The printed report: what produced the figures, one table, the replica loss and the goals."""
    simulated = args.engine == "simulated"
    unit = "virtual s" if simulated else "wall s"
    lines = [header(result, args), "", table(result, unit)]
    killed = result.get("replica_killed")
    if killed and "bound" in killed:
        bound = killed["bound"]
        lines.append(
            f"\nReplica killed (R={killed['replicas']}, SIGKILL at {bound['killed_at_s']:.1f} s, holding "
            f"{bound['requests_lost']:.0f} requests): {killed['lost']} lost, {killed['duplicated']} duplicated, "
            f"{killed['retried']} calls retried. Makespan {killed['makespan_s']:.1f} s against "
            f"{bound['reference_makespan_s']:.1f} s without the kill: grew {bound['growth_s']:.1f} s; allowed "
            f"{bound['allowed_growth_s']:.1f} s = its share of the rest {bound['share_of_rest_s']:.1f} s + redoing "
            f"its lost requests on the others {bound['redo_lost_s']:.1f} s (bound {bound['bound_s']:.1f} s)."
        )
    if "scaling" in result:
        lines.append(f"\nScaling: requests/s at R={result['scaling']['replicas']} = {result['scaling']['x']:.2f}x R=1.")
    lines.append(
        "\nGoals (issue 15): " + "; ".join(f"{name}: {'PASS' if ok else 'FAIL'}" for name, ok in result["goals"])
    )
    return "\n".join(lines)


def header(result: dict[str, Any], args: argparse.Namespace) -> str:
    if args.engine == "vllm":
        source = (
            f"Measured with {result['engine']}, one replica process; wall seconds. The ideal: every request in "
            "one call, after the run. CPU cores and lag are the harness's (driver, replica process), not vLLM's."
        )
    else:
        source = (
            f"Simulated, not measured on a GPU. Engine model: {result['engine']}. Virtual seconds: wall x time "
            "scale (per run below; our own overhead weighs more on a faster clock, so it is the harsher test)."
        )
    defaults = (
        "today's defaults before issue 15 (the JSONL workflow's: chunk_size 32, concurrency 10, 16 chunks in "
        "flight over all replicas)"
        if args.defaults == "before"
        else "size_in_flight(max_num_seqs, replicas): the workflows' defaults"
    )
    return (
        f"{source}\nThe real JSONL job and fan_out against R replica processes running "
        "LLMReplica.run_chunk (shared TokenBatcher, stream mode); "
        f"calls wait FIFO for a free replica slot, {args.latency:g} s "
        f"each way. In-flight work: {defaults}. Occupancy: while work remains (until the last call leaves the driver), "
        "running sequences per step over max_num_seqs x the share of time the engine had work; run occupancy: per "
        "step over the whole run, the end's drain included, beside the ideal's own. Tail: from the first replica "
        "out of work to the end."
    )


def table(result: dict[str, Any], unit: str) -> str:
    columns = [
        ("R", "replicas"), ("requests", "requests"), ("chunk", "chunk_size"), ("concurrency", "concurrency"),
        ("chunks in flight", "chunks_in_flight"), ("scale", "time_scale"), ("occupancy", "occupancy"),
        ("busy", "busy"), ("run occupancy", "run_occupancy"), ("ideal's", "ideal_occupancy"),
        (f"makespan {unit}", "makespan_s"),
        (f"ideal {unit}", "ideal_s"), ("makespan / ideal", "makespan_x_ideal"), ("requests/s", "requests_per_s"),
        (f"tail {unit}", "tail_s"), ("lost", "lost"), ("duplicated", "duplicated"), ("max lag ms", "max_lag_ms"),
        ("CPU cores", "cores"),
    ]  # fmt: skip
    rows = [("base", run) for run in result["runs"]]
    if "long_outputs" in result:
        rows.append(("5% long (max_tokens 2048)", result["long_outputs"]))
    if "replica_killed" in result:
        rows.append(("one replica killed", result["replica_killed"]))
    headers = ["run", *(header for header, _ in columns)]
    return markdown_table(headers, [[name, *(run[key] for _, key in columns)] for name, run in rows])


# -- extra measurements ----------------------------------------------------------------------------


Measure = Callable[..., Awaitable[Any]]


async def scale_check(fleet: list[ReplicaProcess], job: Any, args: argparse.Namespace, measure: Measure) -> None:
    """The same small job at R=2 at time scale 1 and at the scale the benchmark picks: the figures must agree."""
    small = replace(job, name="scale check", requests=args.scale_check_requests)
    rows = []
    for scale in ("1", args.time_scale):
        run = await measure(fleet, small, 2, argparse.Namespace(**{**vars(args), "time_scale": scale}))
        rows.append(
            [
                run.time_scale,
                run.occupancy,
                run.run_occupancy,
                run.ideal_occupancy,
                run.makespan_s,
                run.makespan_x_ideal,
            ]
        )
        print(progress_line(run), file=sys.stderr, flush=True)
    headers = ["scale", "occupancy", "run occupancy", "ideal's", "makespan virtual s", "makespan / ideal"]
    print(f"Time-scale check: {small.requests:,} requests at R=2, the same job at each scale.\n")
    print(markdown_table(headers, rows) + "\n")


async def vllm_ideal(
    replica: ReplicaProcess, path: Path, settings: EngineSettings, baseline: Any
) -> tuple[float, float]:
    """Real vLLM's offline limit for the job: every request in one call, at once (stream mode's `generate(all)`).

    Returns:
        Its wall seconds, and its engine occupancy per step (from the replica's state `baseline` on).
    """
    items = request_items(path)
    started = time.perf_counter()
    outcome = await replica.call("chunk", (RequestChunk(-2, items), settings))
    seconds = time.perf_counter() - started
    return seconds, outcome.replica.engine_counts().since(baseline.engine_counts()).occupancy
