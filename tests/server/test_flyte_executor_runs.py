"""The flyte executor against a launcher standing in for a cluster (which cannot run here), behind `RunLauncher`.

What a remote run adds to the local one, checked: a server that picks a batch up re-attaches to
its run by the name on the batch instead of starting another; a run that fails ends the batch
`failed`, naming the run and its address and no internals, with the lines its journal holds kept;
and a run that cannot be found is started again as the next attempt.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from flyte.io import File

from flyteplugins_batcher.jobs._journal import JournalWriter
from flyteplugins_batcher.replica import FinishedLine
from flyteplugins_batcher.server import ServerSettings
from flyteplugins_batcher.server._execution.flyte_executor import FlyteExecutor, RunFailedError, run_name
from flyteplugins_batcher.server._state.store import LeaseLost, Store


class ClusterRun:
    """A run on the stand-in cluster: it writes its journal as it goes, then ends in `final`."""

    def __init__(self, name: str, folder: str, lines: list[int], final: str) -> None:
        self.name = name
        self.url = f"https://union.example/runs/{name}"
        self.folder = folder
        self.lines = lines
        self.final = final
        self.phases = iter(["queued", "running", "running", final])
        self.aborted = False

    async def phase(self) -> str:
        phase = next(self.phases, self.final)
        if phase == self.final:
            journal = JournalWriter(f"{self.folder}/journal")
            for line in self.lines:
                journal.add(FinishedLine(line, True, {"custom_id": f"r{line}"}, 3, 5))
            await journal.close()
        return phase

    async def abort(self) -> None:
        self.aborted = True

    def failure(self) -> str:
        return "Traceback ... /srv/secret/path.py: boom" if self.final == "failed" else ""


class Cluster:
    """Starts `ClusterRun`s; remembers them by name, as Flyte does."""

    def __init__(self, root: Path, *, final: str = "succeeded", lines: list[int] | None = None) -> None:
        self.root = root
        self.final = final
        self.lines = lines if lines is not None else [1, 2, 3]
        self.runs: dict[str, ClusterRun] = {}
        self.started: list[str] = []
        self.discarded: list[str] = []

    async def start(self, name: str, inputs: dict[str, Any]) -> ClusterRun:
        assert inputs["journal"] == f"{self.folder('b', name)}/journal" and inputs["max_failed_fraction"] == 1.0
        self.started.append(name)
        self.runs[name] = ClusterRun(name, self.folder("b", name), self.lines, self.final)
        return self.runs[name]

    async def attach(self, name: str) -> ClusterRun | None:
        return self.runs.get(name)

    async def input_file(self, path: Path, batch_id: str) -> File:
        return File(path=f"s3://bucket/{batch_id}/input.jsonl")

    def folder(self, batch_id: str, run_name: str) -> str:
        return str(self.root / batch_id / run_name)

    def discard(self, batch_id: str) -> None:
        self.discarded.append(batch_id)

    runs_are_ours = False


class Served:
    served_model = "m"


def a_batch(store: Store, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "input").write_text("".join(f'{{"custom_id": "r{n}"}}\n' for n in range(1, 4)))
    batch = {
        "id": "b",
        "status": "in_progress",
        "input_file_id": "input",
        "expires_at": time.time() + 3600,
        "request_counts": {"total": 3, "completed": 0, "failed": 0},
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    }
    store.insert_batch(batch)
    return batch


class Files:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def content(self, file_id: str, *, param: str = "file_id") -> Path:
        return self.folder / file_id


def executor(store: Store, cluster: Cluster, tmp_path: Path) -> FlyteExecutor:
    settings = ServerSettings(data_dir=tmp_path)
    return FlyteExecutor(store, Files(tmp_path), settings, cluster, Served(), poll_s=0.01)  # type: ignore[arg-type]


def test_a_picked_up_batch_re_attaches_to_its_run_instead_of_starting_another(tmp_path: Path) -> None:
    store = Store(tmp_path / "server.db")
    cluster = Cluster(tmp_path / "runs")
    batch = a_batch(store, tmp_path)
    first = asyncio.run(
        cluster.start(
            run_name("b", 1), {"journal": f"{cluster.folder('b', 'b-1')}/journal", "max_failed_fraction": 1.0}
        )
    )
    store.change_batch(
        "b", lambda b: {**b, "flyte_run": {"name": first.name, "url": first.url, "phase": "running", "attempt": 1}}
    )

    asyncio.run(executor(store, cluster, tmp_path).answer(store.batch("b") or batch, cancelled=asyncio.Event()))

    after = store.batch("b")
    assert cluster.started == ["b-1"] and cluster.discarded == ["b"]  # followed, not started again
    assert after is not None and after["flyte_run"] == {
        "name": "b-1",
        "url": first.url,
        "phase": "succeeded",
        "attempt": 1,
    }
    assert after["request_counts"]["completed"] == 3 and after["usage"]["output_tokens"] == 15


def test_a_run_that_cannot_be_found_is_started_again_as_the_next_attempt(tmp_path: Path) -> None:
    store = Store(tmp_path / "server.db")
    cluster = Cluster(tmp_path / "runs")
    a_batch(store, tmp_path)
    store.change_batch("b", lambda b: {**b, "flyte_run": {"name": "b-1", "url": "", "phase": "running", "attempt": 1}})

    asyncio.run(executor(store, cluster, tmp_path).answer(store.batch("b") or {}, cancelled=asyncio.Event()))

    assert cluster.started == ["b-2"]
    assert (store.batch("b") or {})["flyte_run"]["attempt"] == 2


def test_a_failed_run_names_itself_and_no_internals_and_its_journal_lines_stay(tmp_path: Path) -> None:
    store = Store(tmp_path / "server.db")
    cluster = Cluster(tmp_path / "runs", final="failed", lines=[2])
    batch = a_batch(store, tmp_path)

    with pytest.raises(RunFailedError) as failed:
        asyncio.run(executor(store, cluster, tmp_path).answer(batch, cancelled=asyncio.Event()))

    message = str(failed.value)
    assert "b-1" in message and "https://union.example/runs/b-1" in message
    assert "Traceback" not in message and "/srv/" not in message
    assert store.answered_lines("b") == {2}


def test_a_local_run_whose_batch_another_replica_took_over_is_stopped(tmp_path: Path) -> None:
    store = Store(tmp_path / "server.db")
    cluster = Cluster(tmp_path / "runs")
    cluster.runs_are_ours = True  # local runs: they die with the server that lost the batch
    batch = a_batch(store, tmp_path)
    other = Store(tmp_path / "server.db")
    started = cluster.start

    async def start_then_lose_the_lease(name: str, inputs: dict[str, Any]) -> ClusterRun:
        run = await started(name, inputs)
        assert other.claim("b", force=True)  # another replica takes the batch over as the run starts
        return run

    cluster.start = start_then_lose_the_lease  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        asyncio.run(executor(store, cluster, tmp_path).answer(batch, cancelled=asyncio.Event()))

    assert cluster.runs["b-1"].aborted  # not left running to answer lines the other replica answers
