"""Online requests beside a batch on one engine: an online latency target, and vLLM's own server with priorities.

**Simulated** (`--part simulated`): the server on `SimulatedEngine` (vLLM's continuous batching with
an H100's step times for an 8B model, sleeping instead of computing; 256 sequences), each way a
server of its own, all started first and then run in turns, so that the machine's drift reaches
every way alike:

- **no target**: `serve` as it is by default: online requests go first in the batcher and the
  engine holds its capacity and a quarter more;
- **target T**: `serve --online-ttft-slo-s A --online-tpot-slo-s B`, for each pair of `--targets`.

For each online load (Poisson arrivals of streamed chat requests, `--online-tokens` tokens each),
one run per way: the online load alone for `--idle-s` seconds (the idle figures: the requests that
ended before the batch came), then, with the online load still on, a batch of `--lines` chat lines
through the Batch API (in-process executor); the online requests sent between the batch's first
answered line and its end are the loaded figures. Each way also answers the batch with no online
load: its throughput alone. Reported: online p99 time to first byte (the response's headers), time
to first token (the first content event) and time per output token (the rest of the answer over its
tokens after the first), idle and loaded and their ratio; 429s; the batch's lines/s and its ratio
to alone.

**Real vLLM** (`--part vllm`, the CPU build): the same mix on vLLM's own OpenAI server started
with `--scheduling-policy priority`, where online requests go at priority 0 and the batch's lines
at priority 10 (lower is sooner), the lines sent all at once as a client of its own; and on ours on
vLLM (`serve --engine vllm`, stream mode) with each online target of `--real-targets`, the batch
through the Batch API.
The same engine arguments for both (`--real-*`). Goals: ours' online p99 no worse than vLLM's, its
batch throughput no lower.

    python benchmarks/bench_online_slo.py --part simulated [--rates 2,4,8] [--lines 2000] [--time-scale 2]
    python benchmarks/bench_online_slo.py --part frontier --chart-data docs/benchmarks/data/online_slo_frontier.json
    python benchmarks/bench_online_slo.py --part vllm [--real-lines 96] [--real-rate 0.5] [--real-targets 1/0.15,3/0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._contenders import chat_line
from benchmarks._harness import GSM8K, benchmark_parser, gsm8k_questions
from benchmarks._line_charts import LineChartData, Panel, write_line_chart_data
from benchmarks._sse import first_content_and_tokens
from benchmarks._tables import markdown_table
from benchmarks.bench_serve import percentile
from benchmarks.server_process import ServerProcess, our_server, vllm_server
from flyteplugins_batcher.engines.simulated import SimulatedGpu

BATCH_PRIORITY = 10
"""The batch's lines' priority on vLLM's own server (online requests have its default, 0: lower is sooner)."""


@dataclass(frozen=True)
class Seen:
    """One online request as its client saw it: when it was sent and ended, its status, and its times (seconds)."""

    sent: float
    status: int
    ttfb: float = 0.0
    ttft: float = 0.0
    tpot: float | None = None
    retry_after: int = 0
    ended: float = 0.0


@dataclass
class Run:
    """One way at one online load: the online requests, and the batch's span and lines."""

    way: str
    rate: float
    seen: list[Seen] = field(default_factory=list)
    batch_created: float = 0.0
    batch_first: float = 0.0
    batch_ended: float = 0.0
    lines: int = 0

    @property
    def lines_per_s(self) -> float:
        return self.lines / (self.batch_ended - self.batch_created) if self.batch_ended > self.batch_created else 0.0

    def idle(self) -> list[Seen]:
        """The answered requests that ended before the batch came."""
        return [seen for seen in self.seen if seen.status == 200 and seen.ended < self.batch_created]

    def loaded(self) -> list[Seen]:
        """The answered requests sent while the batch's lines were being answered."""
        return [s for s in self.seen if s.status == 200 and self.batch_first <= s.sent < self.batch_ended]

    def refused(self) -> list[Seen]:
        return [seen for seen in self.seen if seen.status == 429]


def p99(seen: list[Seen], figure: str) -> float:
    """The p99 of one figure (`ttfb`, `ttft`, `tpot`) over the requests that have it."""
    values = [getattr(item, figure) for item in seen if getattr(item, figure) is not None]
    return percentile(values, 0.99)


async def ask(http: httpx.AsyncClient, body: dict[str, Any], started: float) -> Seen:
    """One streamed chat request: its time to first byte (headers), first content, and per token after it."""
    sent = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        headers = time.perf_counter() - sent
        if response.status_code != 200:
            await response.aread()
            retry = int(response.headers.get("Retry-After", "0") or 0)
            ended = time.perf_counter() - started
            return Seen(sent - started, response.status_code, headers, retry_after=retry, ended=ended)
        first, tokens = await first_content_and_tokens(response, sent)
    total = time.perf_counter() - sent
    tpot = (total - first) / (tokens - 1) if tokens > 1 and first else None
    return Seen(sent - started, 200, headers, first or total, tpot, ended=sent - started + total)


async def online_load(
    url: str, prompts: list[str], rate: float, stop: asyncio.Event, *, model: str, tokens: int, seed: int
) -> list[Seen]:
    """Poisson arrivals at `rate` requests/s of streamed chat requests until `stop` is set; every answer awaited."""
    rng, started = random.Random(seed), time.perf_counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        tasks: list[asyncio.Task[Seen]] = []
        while not stop.is_set():
            with_options = {"stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
            messages = [{"role": "user", "content": prompts[len(tasks) % len(prompts)]}]
            body = {"model": model, "messages": messages, "max_tokens": tokens, **with_options}
            tasks.append(asyncio.create_task(ask(http, body, started)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


def batch_file(folder: Path, prompts: list[str], salt: str, model: str, tokens: int) -> Path:
    """A batch file of chat lines; `salt` makes each run's prompts its own."""
    path = folder / f"batch-{salt}.jsonl"
    with path.open("w") as out:
        for number, prompt in enumerate(prompts):
            out.write(
                chat_line(f"q{number}", [{"role": "user", "content": f"{prompt} ({salt})"}], model, tokens) + "\n"
            )
    return path


async def our_batch(url: str, file: Path, run: Run, started: float) -> None:
    """A batch of `file` through the Batch API: created, its first answered line, and its end, as the client polls."""
    async with httpx.AsyncClient(base_url=f"{url}/v1", timeout=120) as http:
        uploaded = await http.post("/files", files={"file": (file.name, file.read_bytes())}, data={"purpose": "batch"})
        body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        batch = (await http.post("/batches", json=body)).json()
        run.batch_created = time.perf_counter() - started
        while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
            await asyncio.sleep(0.2)
            batch = (await http.get(f"/batches/{batch['id']}")).json()
            if not run.batch_first and batch["request_counts"]["completed"]:
                run.batch_first = time.perf_counter() - started
    run.batch_ended = time.perf_counter() - started
    run.lines = batch["request_counts"]["completed"]
    if batch["status"] != "completed":
        raise SystemExit(f"{run.way}: the batch ended {batch['status']}: {batch.get('errors')}")


async def vllm_batch(url: str, file: Path, run: Run, started: float, model: str) -> None:
    """The lines of `file` sent to vLLM's own server all at once, at `BATCH_PRIORITY`, as a batch client does."""
    bodies = [json.loads(line)["body"] for line in file.read_text().splitlines()]
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as http:

        async def line(body: dict[str, Any]) -> None:
            response = await http.post(
                "/v1/chat/completions", json={**body, "model": model, "priority": BATCH_PRIORITY}
            )
            response.raise_for_status()
            if not run.batch_first:
                run.batch_first = time.perf_counter() - started

        run.batch_created = time.perf_counter() - started
        await asyncio.gather(*(line(body) for body in bodies))
    run.batch_ended = time.perf_counter() - started
    run.lines = len(bodies)


async def one_run(server: ServerProcess, run: Run, file: Path, args: Any, *, vllm: bool, model: str) -> Run:
    """The online load alone for `idle_s`, then beside the batch until it ends (no online load: the batch alone)."""
    started, stop = time.perf_counter(), asyncio.Event()
    online = None
    if run.rate > 0:
        prompts = [f"{prompt} (online {run.way} {run.rate})" for prompt in args.prompts]
        load = online_load(
            server.url, prompts, run.rate, stop, model=model, tokens=args.online_tokens, seed=int(run.rate * 1000)
        )
        online = asyncio.create_task(load)
        await asyncio.sleep(args.idle_s)
    if vllm:
        await vllm_batch(server.url, file, run, started, model)
    else:
        await our_batch(server.url, file, run, started)
    stop.set()
    run.seen = await online if online is not None else []
    return run


def simulated_ways(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each way's server flags beyond the engine's: no target, then one per `--targets` pair (ms)."""
    ways: dict[str, list[str]] = {"no target": []}
    for pair in args.targets.split(","):
        ttft_ms, tpot_ms = (float(part) for part in pair.split("/"))
        flags = ["--online-ttft-slo-s", f"{ttft_ms / 1000:g}", "--online-tpot-slo-s", f"{tpot_ms / 1000:g}"]
        ways[f"target {ttft_ms:g} ms / {tpot_ms:g} ms"] = flags
    return ways


def simulated_runs(args: argparse.Namespace, folder: Path) -> list[Run]:
    """Every way's servers started first; then, for no online load and each rate, a run per way in turn."""
    engine = {"time_scale": args.time_scale, "gpu": {"max_num_seqs": args.max_num_seqs}}
    common = ["--engine", "simulated", "--engine-args", json.dumps(engine), "--no-embeddings"]
    common += ["--max-new-tokens", str(args.batch_tokens)]
    ways = simulated_ways(args)
    servers = {way: our_server(folder / f"data-{n}", *common, *flags) for n, (way, flags) in enumerate(ways.items())}
    runs = []
    try:
        for number, rate in enumerate([0.0, *args.rates]):
            names = list(ways)
            for way in names[number % len(names) :] + names[: number % len(names)]:
                file = batch_file(folder, args.batch_prompts, f"{len(runs)}", "simulated", args.batch_tokens)
                run = asyncio.run(one_run(servers[way], Run(way, rate), file, args, vllm=False, model="simulated"))
                runs.append(run)
                print(f"{way}, {rate:g} online/s: batch {run.lines_per_s:.1f} lines/s, {describe(run)}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return runs


def describe(run: Run) -> str:
    idle, loaded = run.idle(), run.loaded()
    if not run.seen:
        return "no online load"
    return (
        f"TTFT p99 {p99(idle, 'ttft') * 1e3:.0f} -> {p99(loaded, 'ttft') * 1e3:.0f} ms, "
        f"TPOT p99 {p99(idle, 'tpot') * 1e3:.1f} -> {p99(loaded, 'tpot') * 1e3:.1f} ms, {len(run.refused())} refused"
    )


def vllm_runs(args: argparse.Namespace, folder: Path) -> list[Run]:
    """vLLM's own server with priorities, then ours on vLLM with an online target: the batch alone, then beside."""
    common = ["--dtype", "float32", "--max-model-len", str(args.real_max_model_len)]
    scheduler = {"max_num_seqs": args.real_max_num_seqs, "max_num_batched_tokens": args.real_max_num_batched_tokens}
    kv_bytes = str(int(args.real_kv_cache_gb * 2**30))
    theirs = [*common, *(f"--{name.replace('_', '-')}={value}" for name, value in scheduler.items())]
    theirs += ["--enforce-eager", "--kv-cache-memory-bytes", kv_bytes, "--scheduling-policy", "priority"]
    ours = ["--engine", "vllm", "--model", args.model, *common, "--enforce-eager", "true", "--no-embeddings"]
    ours += ["--kv-cache-gb", f"{args.real_kv_cache_gb:g}", "--engine-args", json.dumps(scheduler)]
    ours += ["--max-new-tokens", str(args.real_batch_tokens)]
    ways: dict[str, list[str] | None] = {"vLLM's own server, priorities": None}
    for pair in args.real_targets.split(","):
        if pair == "none":
            ways["ours, no target"] = []
            continue
        ttft_s, tpot_s = pair.split("/")
        ways[f"ours, target {ttft_s} s / {tpot_s} s"] = ["--online-ttft-slo-s", ttft_s, "--online-tpot-slo-s", tpot_s]
    if args.ours_first:  # alternate the order across runs, so that the machine's drift favours neither
        ways = dict(reversed(ways.items()))
    prompts = args.batch_prompts[: args.real_lines]
    runs = []
    for number, (way, target) in enumerate(ways.items()):
        started = time.perf_counter()
        vllm = target is None
        server = (
            vllm_server(folder, args.model, *theirs)
            if vllm
            else our_server(folder / f"data-vllm-{number}", *ours, *target)
        )
        print(f"{way}: ready in {time.perf_counter() - started:.0f} s", flush=True)
        try:
            model = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
            for rate in (0.0, args.real_rate):
                file = batch_file(folder, prompts, f"real-{len(runs)}", model, args.real_batch_tokens)
                run = asyncio.run(one_run(server, Run(way, rate), file, args, vllm=vllm, model=model))
                runs.append(run)
                print(f"{way}, {rate:g} online/s: batch {run.lines_per_s:.2f} lines/s, {describe(run)}", flush=True)
        finally:
            server.stop()
    return runs


HEADERS = [
    "way",
    "online/s",
    "answered idle / loaded",
    "429s",
    "TTFB p99 ms idle / loaded",
    "TTFT p99 ms idle / loaded",
    "TTFT loaded / idle",
    "TPOT p99 ms idle / loaded",
    "TPOT loaded / idle",
    "batch lines/s",
    "batch vs alone",
]


def rows(runs: list[Run]) -> list[list[object]]:
    """One row per way and online load; the batch's throughput against the same way's alone."""
    alone = {run.way: run.lines_per_s for run in runs if run.rate == 0}
    table: list[list[object]] = []
    for run in sorted((run for run in runs if run.rate > 0), key=lambda run: (list(alone).index(run.way), run.rate)):
        idle, loaded = run.idle(), run.loaded()
        figures = {name: (p99(idle, name), p99(loaded, name)) for name in ("ttfb", "ttft", "tpot")}
        table.append(
            [
                run.way,
                f"{run.rate:g}",
                f"{len(idle)} / {len(loaded)}",
                len(run.refused()),
                f"{figures['ttfb'][0] * 1e3:,.1f} / {figures['ttfb'][1] * 1e3:,.1f}",
                f"{figures['ttft'][0] * 1e3:,.0f} / {figures['ttft'][1] * 1e3:,.0f}",
                _ratio(*figures["ttft"]),
                f"{figures['tpot'][0] * 1e3:,.1f} / {figures['tpot'][1] * 1e3:,.1f}",
                _ratio(*figures["tpot"]),
                f"{run.lines_per_s:.2f}",
                f"{run.lines_per_s / alone[run.way]:.2f}x" if alone.get(run.way) else "-",
            ]
        )
    return table


def _ratio(idle: float, loaded: float) -> str:
    return f"{loaded / idle:.2f}x" if idle > 0 else "-"


def chart(runs: list[Run], args: argparse.Namespace) -> LineChartData:
    """Online p99 TTFT and TPOT beside the batch, and the batch's share of its throughput alone, against online load."""
    ways = list(dict.fromkeys(run.way for run in runs))
    alone = {run.way: run.lines_per_s for run in runs if run.rate == 0}
    loaded = [run for run in runs if run.rate > 0]

    def series(figure: Any) -> tuple[tuple[str, tuple[tuple[float, float], ...]], ...]:
        return tuple((way, tuple((run.rate, figure(run)) for run in loaded if run.way == way)) for way in ways)

    idle = tuple(run for run in loaded if run.way == ways[0])
    idle_ttft = ("idle (no batch)", tuple((run.rate, p99(run.idle(), "ttft") * 1e3) for run in idle))
    idle_tpot = ("idle (no batch)", tuple((run.rate, p99(run.idle(), "tpot") * 1e3) for run in idle))
    return LineChartData(
        title="Online requests beside a 2,000-line batch on one engine: p99 and the batch's throughput against load",
        unit=f"simulated H100, 8B model, {args.max_num_seqs} sequences; online answers of {args.online_tokens} tokens",
        x_label="online requests/s (Poisson)",
        panels=(
            Panel(
                "online p99 time to first token, ms (log)",
                (*series(lambda r: p99(r.loaded(), "ttft") * 1e3), idle_ttft),
                log=True,
            ),
            Panel(
                "online p99 time per output token, ms", (*series(lambda r: p99(r.loaded(), "tpot") * 1e3), idle_tpot)
            ),
            Panel(
                "batch throughput / alone",
                series(lambda r: r.lines_per_s / alone[r.way]),
                threshold=0.8,
                threshold_label="0.8",
            ),
        ),
        note=f"Time scale {args.time_scale:g}: the simulated GPU runs {args.time_scale:g}x real time; "
        f"{args.lines} lines of at most {args.batch_tokens} tokens (benchmarks/bench_online_slo.py).",
    )


def frontier_chart(gpu: SimulatedGpu, online: int) -> LineChartData:
    """What any room can give on the simulated GPU: online TPOT and batch throughput against the batch's sequences.

    Decoding only (prompts cost nothing here), so both curves are the best case: `online` online
    sequences run beside `n` batch sequences, each step takes `t0 + a x (n + online)`; the online
    requests' TPOT is that over the step with them alone, and the batch makes `n` tokens a step
    against a full engine's `max_num_seqs` tokens of its step, alone.
    """
    alone = gpu.max_num_seqs / gpu.step_time_s(decode_seqs=gpu.max_num_seqs, prefill_tokens=0)
    idle = gpu.step_time_s(decode_seqs=online, prefill_tokens=0)
    tpot, batch = [], []
    for sequences in range(0, gpu.max_num_seqs - online + 1, 4):
        step = gpu.step_time_s(decode_seqs=sequences + online, prefill_tokens=0)
        tpot.append((float(sequences), step / idle))
        batch.append((float(sequences), sequences / step / alone))
    return LineChartData(
        title="What the batch's room can give beside online requests, at best: no room meets 1.5x TPOT and 0.8x batch",
        unit=f"simulated H100 ({gpu.label}), decoding only, {online} online sequences",
        x_label="batch sequences running beside the online ones",
        panels=(
            Panel(
                "online time per output token / idle",
                (("any room", tuple(tpot)),),
                threshold=1.5,
                threshold_label="1.5x",
            ),
            Panel("batch throughput / alone", (("any room", tuple(batch)),), threshold=0.8, threshold_label="0.8x"),
        ),
        note="Step time t0 + a x sequences (7 ms + 0.07 ms); prompts, which only lower both curves, left out "
        "(benchmarks/bench_online_slo.py --part frontier).",
    )


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, data=GSM8K, time_scale=2.0, max_num_seqs=256, model="")
    parser.add_argument("--part", choices=("simulated", "vllm", "both", "frontier"), default="simulated")
    parser.add_argument("--rates", default="2,4,8", help="online requests/s (Poisson), simulated")
    parser.add_argument("--targets", default="30/11,30/20", help="online targets, TTFT ms / TPOT ms, comma-separated")
    parser.add_argument("--lines", type=int, default=2000, help="the batch's lines, simulated")
    parser.add_argument("--batch-tokens", type=int, default=256, help="most tokens of a batch line's answer")
    parser.add_argument("--online-tokens", type=int, default=64, help="tokens of an online answer")
    parser.add_argument("--idle-s", type=float, default=15.0, help="seconds of online load before the batch comes")
    parser.add_argument("--real-lines", type=int, default=96, help="the batch's lines on real vLLM")
    parser.add_argument("--real-batch-tokens", type=int, default=64, help="most tokens of a line's answer, real vLLM")
    parser.add_argument("--real-rate", type=float, default=0.5, help="online requests/s on real vLLM")
    parser.add_argument(
        "--real-targets",
        default="1/0.15,3/0.3",
        help="our online targets on real vLLM, TTFT s / TPOT s, comma-separated ('none': ours without one)",
    )
    parser.add_argument("--ours-first", action="store_true", help="on real vLLM, run ours before vLLM's own server")
    parser.add_argument("--real-max-num-seqs", type=int, default=32)
    parser.add_argument("--real-max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--real-max-model-len", type=int, default=2048)
    parser.add_argument("--real-kv-cache-gb", type=float, default=2.0)
    parser.add_argument("--runs-json", type=Path, help="write every run's requests here (for a closer look)")
    args = parser.parse_args()
    args.rates = [float(rate) for rate in args.rates.split(",") if rate]
    found = gsm8k_questions(args.data.resolve(), args.lines + 64)
    args.prompts, args.batch_prompts = found[:64], found[64:]
    if not args.model and args.part != "simulated":
        from flyteplugins_batcher.engines import bundled_smollm2_path

        args.model = str(bundled_smollm2_path())
    return args


def save_runs(path: Path | None, runs: list[Run]) -> None:
    """Every run's requests and batch span as JSON, when asked for."""
    if path is not None:
        path.write_text(json.dumps([dataclasses.asdict(run) for run in runs]))


def main() -> None:
    args = parse_args()
    if args.part == "frontier":
        write_line_chart_data(args.chart_data, frontier_chart(SimulatedGpu(max_num_seqs=args.max_num_seqs), online=2))
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-online-slo-"))
    if args.part in ("simulated", "both"):
        runs = simulated_runs(args, folder)
        save_runs(args.runs_json, runs)
        print(
            f"\n{args.lines} batch lines, simulated H100 ({args.max_num_seqs} seqs, time scale {args.time_scale:g})\n"
        )
        print(markdown_table(HEADERS, rows(runs)))
        write_line_chart_data(args.chart_data, chart(runs, args))
    if args.part in ("vllm", "both"):
        real = vllm_runs(args, folder)
        sizes = f"{args.real_lines} lines of {args.real_batch_tokens} tokens"
        print(f"\n{sizes}, vLLM's CPU build, {args.real_rate:g} online/s\n")
        print(markdown_table(HEADERS, rows(real)))


if __name__ == "__main__":
    main()
