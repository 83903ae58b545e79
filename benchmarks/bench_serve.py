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

With real vLLM (`--ways vllm-server,ours-vllm`), two more ways answer gsm8k chat requests (64 max
tokens, greedy) with the same model and the same engine arguments (float32, `max_model_len` 2048,
eager, a 2 GiB KV cache), at 16 and 64 clients (`--real-clients`):

- **vLLM's own server**: `python -m vllm.entrypoints.openai.api_server` (the peer);
- **ours on vLLM**: `flyteplugins-batcher serve --engine vllm`.

Each client count runs twice per way, once with whole answers and once streamed (`stream: true`),
each time on prompts of their own (the same for both ways). Reported: requests/s (and ours over
vLLM's), p50/p99 latency, and for streamed requests the time to first token, p50/p99: when the first
content delta arrived, as the client parsed the server-sent events. Goals: ours >= 1.0x vLLM's
server's requests/s; ours' streamed time to first token p50 within 1.2x of vLLM's.

    python benchmarks/bench_serve.py [--requests 512] [--time-scale 2]
    python benchmarks/bench_serve.py --ways vllm-server,ours-vllm [--real-clients 16,64] [--real-requests 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import GSM8K, benchmark_parser, gsm8k_questions
from benchmarks._sse import first_content_and_tokens
from benchmarks._tables import markdown_table
from benchmarks.server_process import ServerProcess, free_port, our_server, start, vllm_server
from flyteplugins_batcher.engines import GenerationConfig, Request
from flyteplugins_batcher.engines.simulated import SimulatedEngine

MAX_TOKENS = 512
REAL_MAX_TOKENS = 64
SIMULATED_WAYS = ("straight", "ours", "flyte-extras")
REAL_WAYS = {"vllm-server": "vLLM's own server", "ours-vllm": "ours (serve --engine vllm)"}
"""The real-vLLM ways, by their `--ways` name: what the tables call them."""


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
    ttfts: list[float] = field(default_factory=list)
    streamed: bool = False
    tokens: int = 0

    @property
    def requests_per_s(self) -> float:
        return self.answered / self.seconds

    def percentile(self, fraction: float) -> float:
        return percentile(self.latencies, fraction)


@dataclass(frozen=True)
class Drive:
    """What closed-loop clients saw: answers, seconds, latencies, times to first token (streamed), output tokens."""

    answered: int
    seconds: float
    latencies: list[float]
    ttfts: list[float]
    tokens: int


def percentile(values: list[float], fraction: float) -> float:
    """The `fraction` percentile of `values` (nearest rank; 0 for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"time_scale": args.time_scale, "gpu": {"max_num_seqs": args.max_num_seqs}}


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


async def drive(
    url: str,
    prompts: list[str],
    clients: int,
    time_limit_s: float,
    *,
    model: str = "simulated",
    max_tokens: int = MAX_TOKENS,
    stream: bool = False,
) -> Drive:
    """`clients` closed-loop clients share `prompts` (greedy chat requests), whole or streamed."""
    queue = list(reversed(prompts))
    latencies: list[float] = []
    ttfts: list[float] = []
    tokens = [0]
    deadline = time.monotonic() + time_limit_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    ask = _streamed if stream else _whole

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=time_limit_s) as http:

        async def client() -> None:
            while queue and time.monotonic() < deadline:
                messages = [{"role": "user", "content": queue.pop()}]
                body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
                latency, first, made = await ask(http, body)
                latencies.append(latency)
                ttfts.append(first)
                tokens[0] += made

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return Drive(len(latencies), time.perf_counter() - started, latencies, ttfts if stream else [], tokens[0])


async def _whole(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, float, int]:
    """One request answered whole: (latency, latency, output tokens; 0 from a server that does not count them)."""
    sent = time.perf_counter()
    response = await http.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    latency = time.perf_counter() - sent
    return latency, latency, (response.json().get("usage") or {}).get("completion_tokens", 0)


async def _streamed(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, float, int]:
    """One request streamed: (latency to `[DONE]`, time to the first content delta, output tokens)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            response.raise_for_status()
        first, tokens = await first_content_and_tokens(response, sent)
    latency = time.perf_counter() - sent
    return latency, first or latency, tokens


def served(server: ServerProcess, way: str, prompts: list[str], clients: int, args: argparse.Namespace) -> Load:
    """One load on a running server, with its batch sizes and its engine's occupancy over the load."""
    before = _engine_view(server, way)
    seen = asyncio.run(drive(server.url, prompts, clients, args.time_limit_s))
    after = _engine_view(server, way)
    batches = after["batches"] - before["batches"]
    steps = after["steps"] - before["steps"]
    occupancy = (after["running"] - before["running"]) / (steps * args.max_num_seqs) if steps else after["occupancy"]
    avg_batch = (after["records"] - before["records"]) / batches if batches else after["avg_batch"]
    return Load(way, clients, seen.answered, seen.seconds, seen.latencies, avg_batch, occupancy)


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
    vllm = {"model": "", "dtype": "float32", "max_model_len": 2048, "kv_cache_gb": 2.0}  # the real-vLLM ways'
    parser = benchmark_parser(__doc__, data=GSM8K, time_scale=2.0, max_num_seqs=64, **vllm)
    parser.add_argument("--requests", type=int, default=512, help="requests per way and client count")
    parser.add_argument("--clients", default="8,32,64,128", help="client counts for our server")
    parser.add_argument("--extras-clients", default="32,64", help="client counts for the flyte.extras pattern")
    parser.add_argument("--time-limit-s", type=float, default=180.0, help="longest one load may run")
    parser.add_argument("--ways", default=",".join(SIMULATED_WAYS), help=f"of {[*SIMULATED_WAYS, *REAL_WAYS]}")
    parser.add_argument("--real-clients", default="16,64", help="client counts for the real-vLLM ways")
    parser.add_argument("--real-requests", type=int, default=128, help="requests per real-vLLM load")
    parser.add_argument("--real-max-num-seqs", type=int, default=128, help="the real-vLLM ways' sequence slots")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="the real-vLLM ways' tokens a step")
    args = parser.parse_args()
    args.ways = args.ways.split(",")
    unknown = set(args.ways) - {*SIMULATED_WAYS, *REAL_WAYS}
    if unknown:
        parser.error(f"unknown ways {sorted(unknown)}; choose from {[*SIMULATED_WAYS, *REAL_WAYS]}")
    args.model_label = args.model
    if not args.model and set(args.ways) & set(REAL_WAYS):
        from flyteplugins_batcher.engines import bundled_smollm2_path

        args.model, args.model_label = str(bundled_smollm2_path()), "SmolLM2-135M-Instruct (bundled)"
    return args


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


REAL_HEADERS = [
    "way",
    "clients",
    "answers",
    "answered",
    "requests/s",
    "ours / vLLM",
    "p50 ms",
    "p99 ms",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "output tokens/s",
]
REAL_WARMUP = 8
"""Requests each real server answers before it is measured (8 clients, prompts of their own)."""


def real_engine_flags(args: argparse.Namespace, way: str) -> list[str]:
    """The same engine arguments for both real ways, each in its server's spelling.

    The scheduler's limits are given to both: unset, vLLM's server takes its serving defaults (on CPU
    128 sequences, 2,048 tokens a step) and our engine vLLM's offline ones (256, 4,096).
    """
    common = ["--dtype", args.dtype, "--max-model-len", str(args.max_model_len)]
    scheduler = {"max_num_seqs": args.real_max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    if way == "vllm-server":
        limits = [f"--{name.replace('_', '-')}={value}" for name, value in scheduler.items()]
        return [*common, *limits, "--enforce-eager", "--kv-cache-memory-bytes", str(int(args.kv_cache_gb * 2**30))]
    engine = ["--engine", "vllm", "--model", args.model, "--enforce-eager", "true"]
    cache = ["--kv-cache-gb", f"{args.kv_cache_gb:g}", "--engine-args", json.dumps(scheduler)]
    return [*engine, *common, *cache, "--no-embeddings"]


def real_prompts(args: argparse.Namespace) -> tuple[list[str], dict[tuple[int, bool], list[str]]]:
    """The warm-up's prompts, and each (clients, streamed) load's: prompts of its own, the same for every way."""
    keys = [(clients, streamed) for clients in _counts(args.real_clients) for streamed in (False, True)]
    found = gsm8k_questions(args.data.resolve(), REAL_WARMUP + args.real_requests * len(keys))
    loads = {key: found[REAL_WARMUP + n * args.real_requests :][: args.real_requests] for n, key in enumerate(keys)}
    return found[:REAL_WARMUP], loads


def real_vllm_loads(args: argparse.Namespace, folder: Path) -> list[Load]:
    """The real-vLLM ways chosen, vLLM's own server first, each on a server of its own."""
    warmup, prompts = real_prompts(args)
    loads = []
    for way in [way for way in REAL_WAYS if way in args.ways]:
        started = time.perf_counter()
        if way == "vllm-server":
            server = vllm_server(folder, args.model, *real_engine_flags(args, way))
        else:
            server = our_server(folder / f"data-{way}", *real_engine_flags(args, way))
        print(f"{REAL_WAYS[way]}: ready in {time.perf_counter() - started:.0f} s", flush=True)
        try:
            model = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
            asyncio.run(
                drive(server.url, warmup, REAL_WARMUP, args.time_limit_s, model=model, max_tokens=REAL_MAX_TOKENS)
            )
            for clients, streamed in prompts:
                loads.append(
                    real_load(server, REAL_WAYS[way], model, prompts[clients, streamed], clients, streamed, args)
                )
        finally:
            server.stop()
    return loads


def real_load(
    server: ServerProcess,
    way: str,
    model: str,
    prompts: list[str],
    clients: int,
    streamed: bool,
    args: argparse.Namespace,
) -> Load:
    """One load of closed-loop clients on a real server, whole or streamed."""
    limit = args.time_limit_s
    seen = asyncio.run(
        drive(server.url, prompts, clients, limit, model=model, max_tokens=REAL_MAX_TOKENS, stream=streamed)
    )
    load = Load(way, clients, seen.answered, seen.seconds, seen.latencies, 0.0, 0.0, seen.ttfts, streamed, seen.tokens)
    answers = "streamed" if streamed else "whole"
    print(f"{way}, {clients} clients, {answers}: {load.requests_per_s:.2f} requests/s", flush=True)
    return load


def _counts(text: str) -> list[int]:
    return [int(count) for count in text.split(",") if count]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}"


def _peer(loads: list[Load], load: Load) -> Load | None:
    """vLLM's own server's load with the same clients and answers as `load`."""
    peers = [peer for peer in loads if peer.way == REAL_WAYS["vllm-server"]]
    return next((peer for peer in peers if (peer.clients, peer.streamed) == (load.clients, load.streamed)), None)


def real_rows(loads: list[Load]) -> list[list[object]]:
    """The real-vLLM table: one row per way, client count and answers (whole or streamed)."""
    table: list[list[object]] = []
    for load in loads:
        peer = _peer(loads, load)
        ttft = (_ms(percentile(load.ttfts, 0.5)), _ms(percentile(load.ttfts, 0.99))) if load.streamed else ("-", "-")
        table.append(
            [
                load.way,
                load.clients,
                "streamed" if load.streamed else "whole",
                load.answered,
                f"{load.requests_per_s:.2f}",
                f"{load.requests_per_s / peer.requests_per_s:.2f}" if peer else "-",
                _ms(load.percentile(0.5)),
                _ms(load.percentile(0.99)),
                *ttft,
                f"{load.tokens / load.seconds:.0f}",
            ]
        )
    return table


def real_goals(loads: list[Load]) -> str:
    """The goals' line: ours over vLLM's own server, requests/s (>= 1.0) and streamed TTFT p50 (<= 1.2)."""
    parts = []
    for load in [load for load in loads if load.way == REAL_WAYS["ours-vllm"]]:
        peer = _peer(loads, load)
        if peer is None:
            continue
        if load.streamed:
            ratio = percentile(load.ttfts, 0.5) / percentile(peer.ttfts, 0.5)
            parts.append(f"{load.clients} clients, streamed: TTFT p50 {ratio:.2f}x (<= 1.2)")
        parts.append(
            f"{load.clients} clients, {'streamed' if load.streamed else 'whole'}: "
            f"requests/s {load.requests_per_s / peer.requests_per_s:.2f}x (>= 1.0)"
        )
    return "Goals, ours / vLLM's own server: " + "; ".join(parts) if parts else ""


def chart_rows(simulated: list[Load], real: list[Load]) -> list[tuple[str, float]]:
    """Each load's requests/s over its reference's: the straight call (simulated), vLLM's own server (real)."""
    rows = []
    if simulated:
        reference = simulated[0]
        for load in simulated[1:]:
            way = "ours" if load.way.startswith("ours") else load.way.removesuffix(" pattern")
            rows.append((f"simulated: {way}, {load.clients} clients", load.requests_per_s / reference.requests_per_s))
    for load in real:
        peer = _peer(real, load)
        if peer is not None and peer is not load:
            answers = "streamed" if load.streamed else "whole"
            rows.append(
                (f"real vLLM: ours, {load.clients} clients, {answers}", load.requests_per_s / peer.requests_per_s)
            )
    return rows


def chart_note(args: argparse.Namespace, simulated: list[Load], real: list[Load]) -> str:
    """Where the chart's numbers come from, and what each row is over."""
    notes = []
    if simulated:
        notes.append(
            f"Simulated rows over the engine called straight: SimulatedEngine (an 8B model's step times on one H100, "
            f"not measured on a GPU), max_num_seqs {args.max_num_seqs}, time scale {args.time_scale:g}, "
            f"{args.requests} requests."
        )
    if real:
        notes.append(
            f"Real vLLM rows over vLLM's own OpenAI server, the same engine arguments: vLLM's CPU build, "
            f"{args.model_label}, {args.dtype}, max_num_seqs {args.real_max_num_seqs}, "
            f"{args.real_requests} requests per load, {REAL_MAX_TOKENS} max tokens."
        )
    return " ".join([*notes, "(benchmarks/bench_serve.py)"])


def simulated_loads(args: argparse.Namespace, folder: Path) -> list[Load]:
    """The simulated ways chosen, and the straight call first whenever one of them runs (it is their reference)."""
    if not set(args.ways) & set(SIMULATED_WAYS):
        return []
    prompts = gsm8k_questions(args.data.resolve(), args.requests)
    reference = asyncio.run(straight(args, prompts))
    print(f"straight call: {reference.requests_per_s:.1f} requests/s", flush=True)
    loads = [reference]
    if "ours" in args.ways:
        loads += our_loads(args, prompts, folder)
    if "flyte-extras" in args.ways:
        loads += flyte_extras_loads(args, prompts, folder)
    print(f"\n{args.requests} gsm8k chat requests, simulated H100 (max_num_seqs {args.max_num_seqs}, ", end="")
    print(f"time scale {args.time_scale})\n")
    print(markdown_table(HEADERS, rows(loads, reference)))
    print(f"\n{goals(loads, reference, args.max_num_seqs)}")
    return loads


def main() -> None:
    args = parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    simulated = simulated_loads(args, folder)
    real = real_vllm_loads(args, folder)
    if real:
        engine = f"{args.dtype}, max_model_len {args.max_model_len}, KV cache {args.kv_cache_gb:g} GiB, " + (
            f"max_num_seqs {args.real_max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}, eager"
        )
        print(f"\n{args.real_requests} gsm8k chat requests per load, {REAL_MAX_TOKENS} max tokens, greedy; ", end="")
        print(f"{args.model_label}, {engine}\n")
        print(markdown_table(REAL_HEADERS, real_rows(real)))
        print(f"\n{real_goals(real)}")
    write_chart_data(
        args.chart_data,
        title="The server's requests/s over its reference's",
        unit="ratio of requests/s, higher is better (1.0: as many as the reference)",
        rows=chart_rows(simulated, real),
        note=chart_note(args, simulated, real),
        digits=2,
    )


if __name__ == "__main__":
    main()
