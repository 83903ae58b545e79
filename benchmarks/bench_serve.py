"""The OpenAI-compatible server under N concurrent clients, beside the same requests sent straight to the engine.

On the simulated GPU engine (vLLM's continuous batching with an H100's step times for an 8B model,
sleeping instead of computing; `max_num_seqs` 64 here, so that 64 clients can fill it), three ways
answer the same gsm8k chat requests:

- **straight to the engine**: every request in one `engine.generate(all)` call, in this process:
  the engine's own limit, with no HTTP and no server;
- **ours**: `make serve`'s server (`python -m flyteplugins_batcher serve --engine simulated`), a process of
  its own, driven by N closed-loop clients over HTTP on 127.0.0.1 (each sends its next request when
  its answer arrives), at 8, 32 (half load) and 64 clients, and 128 (twice the slots);
- **flyte.extras pattern**: flyte-sdk's example app (`benchmarks/flyte_extras_app.py`: a FastAPI app
  with `flyte.extras.TokenBatcher` around the engine's blocking `generate`, called inside
  `async def`), driven by the same clients.

Reported per way: requests/s and its ratio to the straight call, p50 and p99 latency as the
clients saw it, the mean batch size the batcher sent, and the engine's occupancy (running sequences
per step over `max_num_seqs`, counted by the engine). Each run is bounded in requests and in time
(`--time-limit-s`). Goals: at 64 clients ours >= 0.9x the straight call's requests/s; p99 under 2x
p50 at half load; ours ahead of the flyte.extras pattern.

    python benchmarks/bench_serve.py [--requests 512] [--time-scale 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._charts import add_chart_flag, write_chart_data
from benchmarks._tables import markdown_table
from benchmarks.server_process import ServerProcess, free_port, our_server, start
from flyteplugins_batcher.engines import GenerationConfig, Request, SimulatedEngine

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
MAX_TOKENS = 512


@dataclass(frozen=True)
class Load:
    """What one way answered, as its clients saw it."""

    way: str
    clients: int
    answered: int
    seconds: float
    latencies: list[float]
    avg_batch: float
    occupancy: float

    @property
    def requests_per_s(self) -> float:
        return self.answered / self.seconds

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"time_scale": args.time_scale, "gpu": {"max_num_seqs": args.max_num_seqs}}


def questions(path: Path, count: int) -> list[str]:
    with path.open() as lines:
        found = [json.loads(line)["question"] for line, _ in zip(lines, range(count), strict=False)]
    if len(found) < count:
        raise SystemExit(f"{path} has {len(found)} questions, fewer than --requests {count}")
    return found


async def straight(args: argparse.Namespace, prompts: list[str]) -> Load:
    """Every request in one `generate` call on the same simulated engine."""
    engine = SimulatedEngine(**engine_options(args))
    engine.load()
    records = [
        Request([{"role": "user", "content": prompt}], GenerationConfig(max_new_tokens=MAX_TOKENS))
        for prompt in prompts
    ]
    started = time.perf_counter()
    await engine.generate(records)
    seconds = time.perf_counter() - started
    stats = engine.stats
    engine.close()
    return Load(
        "straight to the engine, one call",
        len(prompts),
        len(prompts),
        seconds,
        [],
        len(prompts),
        stats.occupancy or 0.0,
    )


async def drive(url: str, prompts: list[str], clients: int, time_limit_s: float) -> tuple[int, float, list[float]]:
    """`clients` closed-loop clients share `prompts`; returns (answered, seconds, latencies)."""
    queue = list(reversed(prompts))
    latencies: list[float] = []
    deadline = time.monotonic() + time_limit_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=time_limit_s) as http:

        async def client() -> None:
            while queue and time.monotonic() < deadline:
                body = {
                    "model": "simulated",
                    "messages": [{"role": "user", "content": queue.pop()}],
                    "max_tokens": MAX_TOKENS,
                }
                sent = time.perf_counter()
                response = await http.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                latencies.append(time.perf_counter() - sent)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return len(latencies), time.perf_counter() - started, latencies


def served(server: ServerProcess, way: str, prompts: list[str], clients: int, args: argparse.Namespace) -> Load:
    """One load on a running server, with its batch sizes and its engine's occupancy over the load."""
    before = _engine_view(server, way)
    answered, seconds, latencies = asyncio.run(drive(server.url, prompts, clients, args.time_limit_s))
    after = _engine_view(server, way)
    batches = after["batches"] - before["batches"]
    steps = after["steps"] - before["steps"]
    occupancy = (after["running"] - before["running"]) / (steps * args.max_num_seqs) if steps else after["occupancy"]
    avg_batch = (after["records"] - before["records"]) / batches if batches else after["avg_batch"]
    return Load(way, clients, answered, seconds, latencies, avg_batch, occupancy)


def _engine_view(server: ServerProcess, way: str) -> dict[str, float]:
    if way.startswith("flyte.extras"):  # a fresh server per load: its figures since it started are the load's
        stats = httpx.get(f"{server.url}/stats", timeout=10).json()
        return {"batches": 0, "records": 0, "steps": 0, "running": 0, **stats, "avg_batch": stats["avg_batch_size"]}
    metrics = server.metrics()
    return {
        "batches": metrics.get('batcher_batch_size_count{batcher="llm"}', 0.0),
        "records": metrics.get('batcher_batch_size_sum{batcher="llm"}', 0.0),
        "steps": metrics.get("batcher_engine_steps_total{}", 0.0),
        "running": metrics.get("batcher_engine_running_sequences_total{}", 0.0),
        "occupancy": metrics.get("batcher_engine_occupancy_ratio{}", 0.0),
        "avg_batch": 0.0,
    }


def flyte_extras_server(args: argparse.Namespace, folder: Path) -> ServerProcess:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "benchmarks.flyte_extras_app:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    environment = {"BENCH_SIMULATED": json.dumps(engine_options(args))}
    return start(command, port=port, log=folder / "flyte-extras.log", environment=environment)


def rows(loads: list[Load], reference: Load) -> list[list[object]]:
    table = []
    for load in loads:
        latency = (
            (f"{load.percentile(0.5) * 1e3:,.0f}", f"{load.percentile(0.99) * 1e3:,.0f}")
            if load.latencies
            else ("-", "-")
        )
        table.append(
            [
                load.way,
                load.clients,
                load.answered,
                f"{load.requests_per_s:.1f}",
                f"{load.requests_per_s / reference.requests_per_s:.2f}",
                *latency,
                f"{load.percentile(0.99) / load.percentile(0.5):.2f}" if load.latencies else "-",
                f"{load.avg_batch:.1f}",
                f"{load.occupancy:.3f}",
            ]
        )
    return table


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="gsm8k test.jsonl")
    parser.add_argument("--requests", type=int, default=512, help="requests per way and client count")
    parser.add_argument("--clients", default="8,32,64,128", help="client counts for our server")
    parser.add_argument("--extras-clients", default="32,64", help="client counts for the flyte.extras pattern")
    parser.add_argument("--time-scale", type=float, default=2.0, help="the simulated GPU's speed-up over real time")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the simulated engine's sequence slots")
    parser.add_argument("--time-limit-s", type=float, default=180.0, help="longest one load may run")
    add_chart_flag(parser)
    return parser.parse_args()


HEADERS = [
    "way",
    "clients",
    "answered",
    "requests/s",
    "vs straight call",
    "p50 ms",
    "p99 ms",
    "p99/p50",
    "avg batch",
    "occupancy",
]


def our_loads(args: argparse.Namespace, prompts: list[str], folder: Path) -> list[Load]:
    """Our server (one process for every client count: its figures are counted per load)."""
    engine = ["--engine", "simulated", "--engine-args", json.dumps(engine_options(args)), "--no-embeddings"]
    server = our_server(folder / "data", *engine, "--max-new-tokens", str(MAX_TOKENS))
    loads = []
    try:
        for clients in [int(count) for count in args.clients.split(",")]:
            loads.append(served(server, "ours (make serve)", prompts, clients, args))
            print(f"ours, {clients} clients: {loads[-1].requests_per_s:.1f} requests/s", flush=True)
    finally:
        server.stop()
    return loads


def flyte_extras_loads(args: argparse.Namespace, prompts: list[str], folder: Path) -> list[Load]:
    """The flyte.extras pattern (a fresh app per client count: it reports its figures since it started)."""
    loads = []
    for clients in [int(count) for count in args.extras_clients.split(",")]:
        server = flyte_extras_server(args, folder)
        try:
            loads.append(served(server, "flyte.extras pattern", prompts, clients, args))
            print(f"flyte.extras, {clients} clients: {loads[-1].requests_per_s:.1f} requests/s", flush=True)
        finally:
            server.stop()
    return loads


def goals(loads: list[Load], reference: Load, slots: int) -> str:
    """The goals' line: ours at `slots` clients against the straight call and the flyte.extras pattern's best."""
    ours = {load.clients: load for load in loads if load.way.startswith("ours")}
    extras = [load for load in loads if load.way.startswith("flyte")]
    if slots not in ours or slots // 2 not in ours or not extras:
        return ""
    full, half, best = ours[slots], ours[slots // 2], max(extras, key=lambda load: load.requests_per_s)
    return (
        f"Goals: ours at {slots} clients {full.requests_per_s / reference.requests_per_s:.2f}x the straight call "
        f"(>= 0.9); p99/p50 at half load {half.percentile(0.99) / half.percentile(0.5):.2f} (< 2); "
        f"ours {full.requests_per_s / best.requests_per_s:.2f}x the flyte.extras pattern's best (> 1)"
    )


def main() -> None:
    args = parse_args()
    prompts = questions(args.data.resolve(), args.requests)
    folder = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    reference = asyncio.run(straight(args, prompts))
    print(f"straight call: {reference.requests_per_s:.1f} requests/s", flush=True)
    loads = [reference, *our_loads(args, prompts, folder), *flyte_extras_loads(args, prompts, folder)]
    print(f"\n{args.requests} gsm8k chat requests, simulated H100 (max_num_seqs {args.max_num_seqs}, ", end="")
    print(f"time scale {args.time_scale})\n")
    print(markdown_table(HEADERS, rows(loads, reference)))
    print(f"\n{goals(loads, reference, args.max_num_seqs)}")
    write_chart_data(
        args.chart_data,
        title=f"The server under concurrent clients: {args.requests} gsm8k chat requests",
        unit="requests/s, higher is better",
        rows=[
            (load.way if load is reference else f"{load.way}, {load.clients} clients", load.requests_per_s)
            for load in loads
        ],
        note="Simulated, not measured on a GPU: SimulatedEngine (an 8B model's step times on one H100), "
        f"max_num_seqs {args.max_num_seqs}, time scale {args.time_scale:g} (benchmarks/bench_serve.py).",
        digits=1,
    )


if __name__ == "__main__":
    main()
