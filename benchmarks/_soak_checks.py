"""What a soak checks once its traffic stops: batches ended and whole, files whole, no 5xx, a settled footprint.

Each check appends what does not hold to the tally's problems; none raises for a server that misbehaves.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks._soak_traffic import PlannedBatch, Tally
from benchmarks.server_process import ServerProcess

FINAL = ("completed", "failed", "cancelled", "expired")
RSS_TOLERANCE = 0.10
"""How far the RSS at the end may be from the RSS after the warm-up, as a share of the latter."""
OPEN_FILES_SLACK = 16
"""How many more open files than after the warm-up the server may hold at the end (sockets closing, the WAL)."""
TEMPORARY_PREFIX = ".upload-"
"""How `server/_files.py` names a file it is still writing (`tempfile.mkstemp(prefix=...)`)."""
STEPS = "batcher_engine_steps_total{}"
QUEUED = 'batcher_queue_length{batcher="llm"}'


@dataclass(frozen=True)
class Footprint:
    """The server process's resident memory (`VmRSS`, KiB) and open file descriptors."""

    rss_kib: int
    open_files: int


def footprint(pid: int) -> Footprint:
    """The footprint of process `pid`, as `/proc` says now."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return Footprint(rss, len(os.listdir(f"/proc/{pid}/fd")))


def settle(server: ServerProcess, tally: Tally, timeout_s: float = 60.0) -> None:
    """Wait until the LLM's queue is empty and its engine has stopped stepping (two reads 0.5 s apart agree)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = server.metrics()
        time.sleep(0.5)
        after = server.metrics()
        if after.get(STEPS) == before.get(STEPS) and not after.get(QUEUED):
            return
    tally.problems.append(f"the engine was still busy {timeout_s:.0f} s after the traffic stopped")


def final_batches(http: httpx.Client, tally: Tally, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Every batch the soak created, once all have ended (or `timeout_s` has passed: those still running are problems).

    Returns:
        Each batch's object, by id.
    """
    batches: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for planned in tally.batches:
            if batches.get(planned.id, {}).get("status") not in FINAL:
                batches[planned.id] = http.get(f"/v1/batches/{planned.id}").json()
        if all(batch.get("status") in FINAL for batch in batches.values()):
            break
        time.sleep(0.5)
    for batch_id, batch in batches.items():
        if batch.get("status") not in FINAL:
            tally.problems.append(f"batch {batch_id} is still {batch.get('status')} after {timeout_s:.0f} s")
    return batches


def custom_ids(http: httpx.Client, file_id: str | None) -> list[str]:
    """The custom ids in a batch's output or error file, in its order (none without the file)."""
    if file_id is None:
        return []
    response = http.get(f"/v1/files/{file_id}/content")
    response.raise_for_status()
    return [json.loads(line)["custom_id"] for line in response.text.splitlines() if line.strip()]


def check_batches(http: httpx.Client, tally: Tally, ended: dict[str, dict[str, Any]]) -> None:
    """Each batch: ended, its counts adding up, every custom_id once in its files, its bad lines (only) failed."""
    for planned in tally.batches:
        batch = ended[planned.id]
        counts = batch["request_counts"]
        if counts["completed"] + counts["failed"] != counts["total"]:
            tally.problems.append(f"batch {planned.id} ({batch['status']}): counts do not add up: {counts}")
        if (batch["status"] == "failed") != (planned.fails_validation and batch["status"] != "cancelled"):
            tally.problems.append(f"batch {planned.id} is {batch['status']}; meant to fail: {planned.fails_validation}")
        if batch["status"] in FINAL and (batch["output_file_id"] or batch["error_file_id"]):
            _check_files_of(http, tally, planned, batch)


def _check_files_of(http: httpx.Client, tally: Tally, planned: PlannedBatch, batch: dict[str, Any]) -> None:
    """Each custom_id once across the output and error files; a completed batch fails its bad lines only."""
    answered = custom_ids(http, batch["output_file_id"])
    failed = custom_ids(http, batch["error_file_id"])
    seen = Counter(answered + failed)
    twice = sorted(custom_id for custom_id, times in seen.items() if times > 1)
    missing = sorted(set(planned.custom_ids) - set(seen))
    foreign = sorted(set(seen) - set(planned.custom_ids))
    if twice or missing or foreign:
        where = f"batch {planned.id} ({batch['status']})"
        tally.problems.append(f"{where}: twice {twice[:5]}, missing {missing[:5]}, not its own {foreign[:5]}")
    if batch["status"] == "completed" and set(failed) != planned.bad_ids:
        tally.problems.append(
            f"batch {planned.id}: failed lines {sorted(failed)[:5]}, bad lines {sorted(planned.bad_ids)[:5]}"
        )
    if batch["request_counts"]["total"] not in (0, len(planned.custom_ids)):
        tally.problems.append(
            f"batch {planned.id}: total {batch['request_counts']['total']} of {len(planned.custom_ids)} lines"
        )


def listed(http: httpx.Client, path: str, limit: int) -> list[dict[str, Any]]:
    """Every object of a list endpoint (`/v1/batches`, `/v1/files`), page by page (at most 1,000 pages)."""
    objects: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(1000):
        page = http.get(path, params={"limit": limit, **({"after": after} if after else {})}).json()
        objects += page["data"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    return objects


def check_listing(http: httpx.Client, server: ServerProcess, tally: Tally, statuses: Counter[str]) -> None:
    """The server lists exactly the soak's batches, and its `batcher_batch_jobs` gauge counts their statuses."""
    ids = [batch["id"] for batch in listed(http, "/v1/batches", 100)]
    if sorted(ids) != sorted(planned.id for planned in tally.batches):
        tally.problems.append(
            f"the server lists {len(ids)} batches ({len(set(ids))} ids); the soak made {len(tally.batches)}"
        )
    gauge = {key: value for key, value in server.metrics().items() if key.startswith("batcher_batch_jobs{")}
    counted = {f'batcher_batch_jobs{{status="{status}"}}': float(n) for status, n in statuses.items()}
    if {key: value for key, value in gauge.items() if value} != counted:
        tally.problems.append(f"batcher_batch_jobs says {gauge}; the batches are {dict(statuses)}")


def check_files(http: httpx.Client, data_dir: Path, tally: Tally) -> None:
    """No temporary file left in the files folder; every file has its row, every row its file, of its size."""
    rows = {row["id"]: row for row in listed(http, "/v1/files", 10_000)}
    folder = data_dir / "files"
    names = {path.name for path in folder.iterdir()}
    temporary = sorted(name for name in names if name.startswith(TEMPORARY_PREFIX))
    if temporary:
        tally.problems.append(f"temporary files left in {folder}: {temporary[:5]}")
    orphans = sorted(names - set(rows) - set(temporary))
    if orphans:
        tally.problems.append(f"files without a row: {orphans[:5]}")
    for file_id, row in rows.items():
        path = folder / file_id
        size = path.stat().st_size if path.is_file() else None
        if size != row["bytes"]:
            tally.problems.append(f"file {file_id}: the store says {row['bytes']} bytes, the folder holds {size}")


def check_statuses(server: ServerProcess, tally: Tally) -> None:
    """No 5xx: none that the clients saw (counted as they came) and none in the server's own count."""
    server_errors = sum(
        value
        for key, value in server.metrics().items()
        if key.startswith("batcher_http_requests_total{") and 'outcome="server_error"' in key
    )
    if server_errors:
        tally.problems.append(f"the server counted {server_errors:.0f} answers with a 5xx")
    raised = logged_exceptions(server.log)
    if raised:
        tally.problems.append(f"the server logged {sum(raised.values())} tracebacks ({server.log}): {dict(raised)}")


def logged_exceptions(log: Path) -> Counter[str]:
    """The exceptions whose tracebacks a log holds, by their last line's exception type."""
    raised: Counter[str] = Counter()
    in_traceback = False
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and line and not line.startswith(" "):
            raised[line.split(":", 1)[0]] += 1
            in_traceback = False
    return raised


def check_footprint(warm: Footprint | None, end: Footprint | None, tally: Tally) -> None:
    """The RSS at the end within `RSS_TOLERANCE` of the RSS after the warm-up; open files no more than a few over."""
    if warm is None or end is None:
        tally.problems.append("the footprint was not read")
        return
    if abs(end.rss_kib / warm.rss_kib - 1) > RSS_TOLERANCE:
        tally.problems.append(f"RSS {warm.rss_kib} KiB after the warm-up, {end.rss_kib} KiB at the end")
    if end.open_files > warm.open_files + OPEN_FILES_SLACK:
        tally.problems.append(f"{warm.open_files} open files after the warm-up, {end.open_files} at the end")
