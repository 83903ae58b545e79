"""The Batch API's two executors beside `run-batch` on one large file, and online latency while a batch runs.

On the simulated GPU engine (vLLM's continuous batching with an H100's step times for an 8B
model, sleeping instead of computing), one file of gsm8k chat lines is answered three ways:

- **run-batch**: `python -m flyteplugins_batcher run-batch -i FILE -o DIR` (the JSONL job through
  flyte's local runner), timed from the command's start to its exit, start-up included;
- **server, flyte executor**: `serve --batch-executor flyte --local-runs process`: the batch is a
  run of the same job, in a process of its own with its own replica (as on a cluster, where the
  run's chunks go to the GPU replicas), timed from `POST /v1/batches` to the batch's `completed`,
  as its client polls it (every 0.2 s);
- **server, in-process executor**: `serve` (the default), timed the same way.

The servers start first (their start-up is not timed; run-batch's is, as a user pays it). Rounds
alternate the order of the three ways, each run on prompts of its own (no cached chunk is
reused), and the table keeps each way's median. Goal: the flyte executor takes at most 1.1x
run-batch's time.

Then online latency: 4 closed-loop clients send chat requests to the flyte-executor server, first
idle, then while a batch of twice the file runs, and the same to the in-process server. Reported:
p50 and p99 latency and the busy/idle p99 ratio. Goal: the flyte executor's busy p99 within 2x of
its idle p99: the app's engine serves online requests while the run's replica answers the batch.
The in-process executor shares one engine between both: online requests go ahead of batch lines in
its batcher (`ONLINE_PRIORITY`), but share every step with the batch's sequences.

    python benchmarks/bench_batch_executor.py [--lines 2000] [--rounds 3] [--time-scale 1] [--max-num-seqs 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import GSM8K, benchmark_parser, gsm8k_questions
from benchmarks._tables import markdown_table
from benchmarks.bench_serve import Drive, drive, percentile
from benchmarks.server_process import ServerProcess, our_server


@dataclass(frozen=True)
class Timed:
    """One way's time for the whole file, and what it answered."""

    way: str
    seconds: float
    answered: int
    failed: int


def engine_flags(args: argparse.Namespace) -> list[str]:
    options = {"time_scale": args.time_scale, "gpu": {"max_num_seqs": args.max_num_seqs}}
    return ["--engine", "simulated", "--engine-args", json.dumps(options), "--max-new-tokens", str(args.max_tokens)]


def write_file(path: Path, prompts: list[str], salt: str) -> Path:
    """A batch file of chat lines; `salt` makes its prompts new to flyte's cache (no chunk is reused)."""
    with path.open("w") as out:
        for number, prompt in enumerate(prompts):
            body = {"model": "simulated", "messages": [{"role": "user", "content": f"{prompt} ({salt})"}]}
            line = {"custom_id": f"q{number}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            out.write(json.dumps(line) + "\n")
    return path


def run_batch(args: argparse.Namespace, file: Path, folder: Path) -> Timed:
    """`run-batch` on the file, start-up included, as a user runs it."""
    command = [sys.executable, "-m", "flyteplugins_batcher", "run-batch", "-i", str(file), "-o", str(folder / "out")]
    started = time.perf_counter()
    subprocess.run([*command, *engine_flags(args), "--model-mismatch", "ignore"], check=True, capture_output=True)
    seconds = time.perf_counter() - started
    results = (folder / "out" / "results.jsonl").read_text().splitlines()
    errors = (folder / "out" / "errors.jsonl").read_text().splitlines()
    return Timed("run-batch (command, start-up included)", seconds, len(results), len(errors))


def server_batch(server: ServerProcess, way: str, file: Path) -> Timed:
    """A batch of the file on a running server, from its creation to its end, as its client polls it."""
    with httpx.Client(base_url=f"{server.url}/v1", timeout=60) as http:
        uploaded = http.post("/files", files={"file": (file.name, file.read_bytes())}, data={"purpose": "batch"})
        body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        started = time.perf_counter()
        batch = http.post("/batches", json=body).json()
        while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(0.2)
            batch = http.get(f"/batches/{batch['id']}").json()
        seconds = time.perf_counter() - started
    if batch["status"] != "completed":
        raise SystemExit(f"{way}: the batch ended {batch['status']}: {batch.get('errors')}")
    counts = batch["request_counts"]
    return Timed(way, seconds, counts["completed"], counts["failed"])


def online(server: ServerProcess, prompts: list[str], args: argparse.Namespace) -> Drive:
    return asyncio.run(drive(server.url, prompts, args.online_clients, 600, max_tokens=args.online_max_tokens))


def online_beside_batch(server: ServerProcess, prompts: list[str], file: Path, args: argparse.Namespace) -> Drive:
    """Online load while a batch of the file runs (started first, and running when the load starts)."""
    with httpx.Client(base_url=f"{server.url}/v1", timeout=60) as http:
        uploaded = http.post("/files", files={"file": (file.name, file.read_bytes())}, data={"purpose": "batch"})
        body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        batch = http.post("/batches", json=body).json()
        while batch["request_counts"]["completed"] == 0:  # the batch's lines are in the engine
            time.sleep(0.2)
            batch = http.get(f"/batches/{batch['id']}").json()
        seen = online(server, prompts, args)
        still_running = http.get(f"/batches/{batch['id']}").json()["status"] == "in_progress"
        http.post(f"/batches/{batch['id']}/cancel")
    if not still_running:
        print(f"note: the batch ended before the online load did ({args.online_requests} requests)", flush=True)
    return seen


EXECUTORS = ("flyte", "in-process")


def start_servers(args: argparse.Namespace, folder: Path) -> dict[str, ServerProcess]:
    """A server per executor, on the same engine settings (started before any timing: start-up is not timed)."""
    servers: dict[str, ServerProcess] = {}
    for executor in EXECUTORS:
        flags = [*engine_flags(args), "--no-embeddings", "--batch-executor", executor]
        if executor == "flyte":  # the deployed shape: the run has a replica of its own, the server's engine is online's
            flags += ["--local-runs", args.local_runs]
        servers[executor] = our_server(folder / f"data-{executor}", *flags)
    return servers


def timed_rounds(
    args: argparse.Namespace, servers: dict[str, ServerProcess], folder: Path, prompts: list[str]
) -> list[list[Timed]]:
    """Each way's time for the file, round after round, each round in another order; new prompts per run."""
    ways = ["run-batch", *EXECUTORS]
    rounds: list[list[Timed]] = []
    for number in range(args.rounds):
        order = ways[number % len(ways) :] + ways[: number % len(ways)]  # the machine's drift reaches every way
        timings: dict[str, Timed] = {}
        for way in order:
            file = write_file(folder / f"{way}-{number}.jsonl", prompts, f"{way}-{number}")
            if way == "run-batch":
                timings[way] = run_batch(args, file, folder / f"run-{number}")
            else:
                timings[way] = server_batch(servers[way], f"server, {way} executor (create to completed)", file)
            print(f"round {number + 1}: {timings[way].way}: {timings[way].seconds:.1f} s", flush=True)
        rounds.append([timings[way] for way in ways])
    return rounds


def latencies(
    args: argparse.Namespace, server: ServerProcess, executor: str, folder: Path, prompts: list[str]
) -> dict[str, Drive]:
    """Online latency on an idle server, then beside a batch of twice the file."""
    online_prompts = [f"{prompt} (online)" for prompt in prompts[: args.online_requests]]
    idle = online(server, online_prompts, args)
    busy_file = write_file(folder / f"{executor}-busy.jsonl", prompts * 2, f"{executor}-busy")
    return {"idle": idle, "busy": online_beside_batch(server, online_prompts, busy_file, args)}


def time_rows(timings: list[Timed], rounds: list[list[Timed]]) -> list[list[object]]:
    reference = timings[0].seconds
    rows: list[list[object]] = []
    for position, timed in enumerate(timings):
        each = " / ".join(f"{run[position].seconds:.1f}" for run in rounds)
        rows.append(
            [timed.way, f"{timed.seconds:.1f}", f"{timed.seconds / reference:.2f}x", timed.answered, timed.failed, each]
        )
    return rows


def latency_rows(runs: dict[str, dict[str, Any]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for executor, run in runs.items():
        idle, busy = run["idle"], run["busy"]
        ratio = percentile(busy.latencies, 0.99) / percentile(idle.latencies, 0.99)
        for label, seen in (("idle", idle), ("beside a batch", busy)):
            p50, p99 = percentile(seen.latencies, 0.5), percentile(seen.latencies, 0.99)
            rows.append([executor, label, seen.answered, f"{p50 * 1000:.0f}", f"{p99 * 1000:.0f}", ""])
        rows[-1][-1] = f"{ratio:.2f}x"
    return rows


def ingest_rate(folder: Path, lines: int, database: str) -> float:
    """Lines per second the server records from a run's journal (segments of 2,000 result lines) into `database`."""
    from flyteplugins_batcher.jobs._journal import JournalWriter
    from flyteplugins_batcher.replica import FinishedLine
    from flyteplugins_batcher.server._execution.flyte_executor import JournalIngest
    from flyteplugins_batcher.server._state.store import Store

    async def write() -> None:
        journal = JournalWriter(str(folder / "journal"), interval_s=0)
        body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 800}}]}
        for line in range(1, lines + 1):
            journal.add(FinishedLine(line, True, {"custom_id": f"q{line}", "response": {"body": body}}, 60, 200))
            if line % 2000 == 0:
                await journal.flush()
        await journal.close()

    asyncio.run(write())
    store = Store(database or folder / "server.db")
    counts = {"total": lines, "completed": 0, "failed": 0}
    store.insert_batch(
        {
            "id": "batch_ingest",
            "status": "in_progress",
            "request_counts": counts,
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        }
    )
    started = time.perf_counter()
    recorded = asyncio.run(JournalIngest(store, "batch_ingest", str(folder / "journal")).read())
    seconds = time.perf_counter() - started
    store.close()
    assert recorded == lines
    return lines / seconds


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, data=GSM8K, rounds=3, time_scale=1.0, max_num_seqs=256)
    parser.add_argument("--lines", type=int, default=2000, help="chat lines in the batch file")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per answer (the engine's default)")
    parser.add_argument("--ingest-lines", type=int, default=20000, help="journal lines for the ingest rate")
    parser.add_argument("--database-url", default="", help="also measure the ingest rate on this PostgreSQL")
    parser.add_argument("--local-runs", default="process", help="the flyte server's local runs: process or server")
    parser.add_argument("--online-clients", type=int, default=4, help="closed-loop online clients")
    parser.add_argument("--online-requests", type=int, default=64, help="online requests per load")
    parser.add_argument("--online-max-tokens", type=int, default=64, help="tokens per online answer")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    prompts = gsm8k_questions(args.data, args.lines)
    with tempfile.TemporaryDirectory(prefix="bench-executor-") as temporary:
        folder = Path(temporary)
        servers = start_servers(args, folder)
        try:
            rounds = timed_rounds(args, servers, folder, prompts)
            runs = {executor: latencies(args, servers[executor], executor, folder, prompts) for executor in EXECUTORS}
        except Exception:
            for executor, server in servers.items():
                print(f"the {executor} server's log ends:\n{server.log_tail(60)}", flush=True)
            raise
        finally:
            for server in servers.values():
                server.stop()
    timings = [median_timed(way) for way in zip(*rounds, strict=True)]
    print(f"\n{args.lines} chat lines, {args.max_tokens} tokens at most, simulated H100 (time scale {args.time_scale})")
    print(f"median of {args.rounds} rounds (each round in another order)")
    print(
        markdown_table(
            ["way", "seconds", "vs run-batch", "answered", "failed", "rounds (s)"], time_rows(timings, rounds)
        )
    )
    print(f"\nonline: {args.online_clients} clients, {args.online_requests} requests, {args.online_max_tokens} tokens")
    print(markdown_table(["executor", "load", "answered", "p50 ms", "p99 ms", "busy/idle p99"], latency_rows(runs)))
    print(goals(timings, runs))
    print_ingest_rates(args)
    rows = [(timed.way.split(" (")[0], timed.seconds) for timed in timings]
    title = "Time for one batch file (s), simulated H100"
    write_chart_data(args.chart_data, title=title, unit="s", rows=rows, digits=1)


def print_ingest_rates(args: argparse.Namespace) -> None:
    """How fast the server keeps up with runs: lines recorded per second from a journal, per database."""
    rows = []
    for name, database in (("SQLite", ""), ("PostgreSQL", args.database_url)):
        if name == "SQLite" or database:
            with tempfile.TemporaryDirectory(prefix="bench-ingest-") as temporary:
                rows.append(
                    [name, args.ingest_lines, f"{ingest_rate(Path(temporary), args.ingest_lines, database):,.0f}"]
                )
    print(f"\nrecording a run's journal ({args.ingest_lines} lines of about 1 KB)")
    print(markdown_table(["database", "lines", "lines/s"], rows))


def median_timed(runs: tuple[Timed, ...]) -> Timed:
    ordered = sorted(runs, key=lambda timed: timed.seconds)
    return ordered[len(ordered) // 2]


def goals(timings: list[Timed], runs: dict[str, dict[str, Any]]) -> str:
    flyte_ratio = timings[1].seconds / timings[0].seconds  # medians
    busy, idle = runs["flyte"]["busy"].latencies, runs["flyte"]["idle"].latencies
    busy_ratio = percentile(busy, 0.99) / percentile(idle, 0.99)
    return (
        f"\ngoals: the flyte executor takes {flyte_ratio:.2f}x run-batch's time "
        f"(<= 1.1x: {'met' if flyte_ratio <= 1.1 else 'NOT met'}); online p99 beside a batch is {busy_ratio:.2f}x "
        f"idle (<= 2x: {'met' if busy_ratio <= 2 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
