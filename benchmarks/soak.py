"""A soak that loses nothing: one server on the simulated engine under mixed traffic for N minutes, then checked.

A bounded number of clients (`--clients`, closed-loop, seeded) send every kind of request the
server takes or must refuse (`benchmarks/_soak_traffic.py`, `benchmarks/_soak_requests.py`):
online chat and text completions, whole and streamed, streams abandoned after their first events,
requests abandoned by a client timeout while they wait, embeddings, batches (some cancelled, some
failing validation, some with bad lines), uploads refused (over `--max-upload-mb`, not multipart,
not JSONL), malformed and unauthorized requests. A warm-up phase comes first; the server's
footprint is read after it, once the engine is idle, and again at the end.

At the end it checks, and lists as problems what does not hold:

- every batch it created has ended (`completed`, `failed`, `cancelled`, `expired`) with
  `completed + failed == total`, and the server lists exactly those batches;
- every custom_id of an ended batch is in its output or error file exactly once (a completed
  batch's bad lines, and only those, in its error file);
- the server's RSS (`/proc/<pid>/status` VmRSS) at the end, after a short idle, is within 10% of
  its RSS after the warm-up;
- no temporary upload (`.upload-*`, `server/_files.py`) is left in the data folder, every file has
  its row and every row its file, of the size the store says;
- no answer was a 5xx (a 503 while the engine restarts is counted apart: there should be none),
  as the clients saw it and as the server's own `/metrics` counted it;
- the same request got the same text every time, whole or streamed (the simulated engine is
  deterministic); the engine is idle once traffic stops.

    python benchmarks/soak.py --minutes 10 [--seed 0] [--clients 8]   (make soak MINUTES=10)
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._harness import benchmark_parser
from benchmarks._soak_checks import (
    Footprint,
    check_batches,
    check_files,
    check_footprint,
    check_listing,
    check_statuses,
    final_batches,
    footprint,
    settle,
)
from benchmarks._soak_requests import MAX_REQUEST_MB, MAX_UPLOAD_MB, batch, malformed, refused_upload
from benchmarks._soak_traffic import (
    API_KEY,
    CHAT,
    TEXT,
    Action,
    Client,
    Tally,
    delete_input,
    embeddings,
    prompts,
    reads,
    run_client,
    stream_abandoned,
    streamed_answer,
    wait_abandoned,
    whole_answer,
)
from benchmarks._tables import markdown_table
from benchmarks.server_process import ServerProcess, our_server


@dataclass(frozen=True)
class SoakOptions:
    """What a soak runs.

    Attributes:
        minutes: Traffic time, warm-up included.
        seed: Seeds every client's choices.
        clients: Concurrent clients.
        time_scale: The simulated GPU's speed over real time.
        embeddings: Serve and send embeddings too (the bundled MiniLM, on CPU).
        warmup_share: The share of `minutes` that is warm-up (at least 15 s).
        folder: Where the server's data folder and log go (a new temporary folder when `None`).
    """

    minutes: float = 10.0
    seed: int = 0
    clients: int = 8
    time_scale: float = 2.0
    embeddings: bool = True
    warmup_share: float = 0.2
    folder: Path | None = None

    @property
    def warmup_s(self) -> float:
        return max(15.0, self.minutes * 60 * self.warmup_share)


@dataclass
class SoakResult:
    """What a soak saw: the clients' tally, the batches' final statuses, the footprints, and the problems."""

    options: SoakOptions
    tally: Tally
    batch_statuses: Counter[str] = field(default_factory=Counter)
    warm: Footprint | None = None
    end: Footprint | None = None
    seconds: float = 0.0
    log: Path | None = None

    @property
    def problems(self) -> list[str]:
        return self.tally.problems


def kinds(with_embeddings: bool) -> dict[str, tuple[float, Action]]:
    """Each kind of request: its weight in the mix, and what sends it."""
    mix: dict[str, tuple[float, Action]] = {
        "chat": (18, lambda client: whole_answer(client, CHAT)),
        "completion": (6, lambda client: whole_answer(client, TEXT)),
        "chat, streamed": (14, lambda client: streamed_answer(client, CHAT)),
        "completion, streamed": (4, lambda client: streamed_answer(client, TEXT)),
        "stream abandoned": (8, stream_abandoned),
        "wait abandoned": (8, wait_abandoned),
        "batch": (6, batch),
        "upload refused": (3, refused_upload),
        "malformed": (8, malformed),
        "read": (4, reads),
        "delete input": (2, delete_input),
    }
    if with_embeddings:
        mix["embeddings"] = (6, embeddings)
    return mix


def server_flags(options: SoakOptions) -> list[str]:
    """The soak's server: the simulated engine, small body limits, an API key."""
    engine = ["--engine", "simulated", "--engine-args", json.dumps({"time_scale": options.time_scale})]
    limits = ["--max-upload-mb", str(MAX_UPLOAD_MB), "--max-request-mb", str(MAX_REQUEST_MB)]
    return [*engine, *limits, "--api-key", API_KEY, *([] if options.embeddings else ["--no-embeddings"])]


async def traffic(url: str, options: SoakOptions, tally: Tally, *, seconds: float, phase: int) -> None:
    """`options.clients` clients send mixed requests for `seconds` (each finishes the request it is in)."""
    until = time.monotonic() + seconds
    mix, questions = kinds(options.embeddings), prompts()

    async def count(response: httpx.Response) -> None:
        tally.statuses[response.status_code] += 1
        if response.status_code >= 500:
            tally.problems.append(f"{response.request.method} {response.request.url.path}: {response.status_code}")

    async def one(number: int) -> None:
        rng = random.Random(f"{options.seed}/{phase}/{number}")
        headers = {"Authorization": f"Bearer {API_KEY}"}
        hooks = {"response": [count]}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60.0, event_hooks=hooks) as http:
            client = Client(http, rng, tally, f"p{phase}c{number}", questions, options.embeddings)
            await run_client(client, mix, until)

    await asyncio.wait_for(asyncio.gather(*(one(number) for number in range(options.clients))), seconds + 120)


def run_soak(options: SoakOptions) -> SoakResult:
    """Start a server, send the traffic (warm-up, then the rest), wait for the batches, check everything."""
    folder = options.folder or Path(tempfile.mkdtemp(prefix="soak-"))
    started = time.monotonic()
    server = our_server(folder / "data", *server_flags(options))
    result = SoakResult(options, Tally(), log=server.log)
    try:
        asyncio.run(traffic(server.url, options, result.tally, seconds=options.warmup_s, phase=0))
        settle(server, result.tally)
        result.warm = footprint(server.process.pid)
        rest_s = max(0.0, options.minutes * 60 - options.warmup_s)
        asyncio.run(traffic(server.url, options, result.tally, seconds=rest_s, phase=1))
        _check(server, folder / "data", result)
    finally:
        server.stop()
    result.seconds = time.monotonic() - started
    return result


def _check(server: ServerProcess, data_dir: Path, result: SoakResult) -> None:
    """Wait for every batch to end and the engine to idle, read the footprint, then check what must hold."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60.0) as http:
        ended = final_batches(http, result.tally, timeout_s=180.0)
        settle(server, result.tally)
        time.sleep(2.0)  # a short idle
        result.end = footprint(server.process.pid)
        result.batch_statuses = Counter(batch["status"] for batch in ended.values())
        check_batches(http, result.tally, ended)
        check_listing(http, server, result.tally, result.batch_statuses)
        check_files(http, data_dir, result.tally)
    check_statuses(server, result.tally)
    check_footprint(result.warm, result.end, result.tally)


def summary(result: SoakResult) -> str:
    """The soak's tables: requests by kind and outcome, batches by final status, the footprint, the problems."""
    requests = sorted(result.tally.outcomes.items())
    parts = [markdown_table(["kind", "outcome", "requests"], [[kind, outcome, n] for (kind, outcome), n in requests])]
    parts.append(markdown_table(["batches", "count"], sorted(result.batch_statuses.items())))
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(result.tally.statuses.items()))
    parts.append(f"HTTP statuses the clients got: {statuses}")
    if result.warm and result.end:
        rows = [
            ["RSS MiB", f"{result.warm.rss_kib / 1024:.1f}", f"{result.end.rss_kib / 1024:.1f}"],
            ["open files", result.warm.open_files, result.end.open_files],
        ]
        ratio = result.end.rss_kib / result.warm.rss_kib
        parts.append(
            markdown_table(["server", "after warm-up", "at the end"], rows) + f"\n\nRSS end/warm-up: {ratio:.3f}"
        )
    problems = "\n".join(f"- {problem}" for problem in result.problems[:50]) or "none"
    parts.append(f"Problems ({len(result.problems)}):\n{problems}")
    return "\n\n".join(parts)


def parse_args() -> SoakOptions:
    parser = benchmark_parser(__doc__, chart=False, time_scale=2.0)
    parser.add_argument("--minutes", type=float, default=10.0, help="traffic time, warm-up included")
    parser.add_argument("--seed", type=int, default=0, help="seeds every client's choices")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--no-embeddings", action="store_true", help="serve and send no embeddings")
    parser.add_argument("--folder", type=Path, default=None, help="the server's data folder and log go here")
    args = parser.parse_args()
    return SoakOptions(
        args.minutes, args.seed, args.clients, args.time_scale, not args.no_embeddings, folder=args.folder
    )


def main() -> None:
    options = parse_args()
    print(f"soak: {options.minutes:g} min, {options.clients} clients, seed {options.seed}", flush=True)
    result = run_soak(options)
    total = sum(result.tally.outcomes.values())
    print(f"\n{total} requests in {result.seconds:.0f} s (server log: {result.log})\n\n{summary(result)}")
    sys.exit(1 if result.problems else 0)


if __name__ == "__main__":
    main()
