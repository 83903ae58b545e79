"""The store on SQLite and on PostgreSQL: files, batches, answered lines, changes in one transaction, leases.

Every test runs on both databases. Two `Store` objects on one database are two server replicas:
each has its own owner id, and the leases decide which of them runs a batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flyteplugins_batcher.replica import FinishedLine
from flyteplugins_batcher.server import ServerSettings
from flyteplugins_batcher.server._execution.leases import LeaseKeeper
from flyteplugins_batcher.server._execution.runner import BatchRunner
from flyteplugins_batcher.server._state.batches import batch_creation, moved, new_batch
from flyteplugins_batcher.server._state.files import FileStore
from flyteplugins_batcher.server._state.store import Lease, LeaseLost, Store, engine_url, shown_url

LEASE_S = 0.4
"""Short, so that a lease lapses within a test."""

StoreFactory = Callable[..., Store]


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """A new, empty database of each kind: an SQLite file, or a database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return tmp_path / "server.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def replica(database: str | Path) -> Iterator[StoreFactory]:
    """`replica()`: a new store (a server) on the test's database; all are closed when it ends."""
    opened: list[Store] = []

    def open_one(**options: Any) -> Store:
        store = Store(database, **{"lease_s": LEASE_S, **options})
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.close()


def a_batch(batch_id: str = "batch_1", status: str = "in_progress", total: int = 0, **fields: Any) -> dict[str, Any]:
    body = {"input_file_id": "file-in", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch = new_batch(batch_creation(body), input_file={"id": "file-in", "purpose": "batch"}, model="m")
    if status != "validating":
        batch = moved(batch, status)
    return {**batch, "id": batch_id, "request_counts": {"total": total, "completed": 0, "failed": 0}, **fields}


def a_file(file_id: str, purpose: str = "batch") -> dict[str, Any]:
    return {"id": file_id, "filename": f"{file_id}.jsonl", "purpose": purpose, "bytes": 10, "created_at": 1}


def lapse() -> None:
    time.sleep(LEASE_S + 0.2)


# -- files and batches -----------------------------------------------------------------------------


def test_files_are_kept_listed_a_page_at_a_time_and_deleted(replica: StoreFactory) -> None:
    store = replica()
    for n in range(5):
        store.insert_file(a_file(f"file-{n}", purpose="batch" if n % 2 == 0 else "batch_output"))

    newest = store.files(purpose=None, after=None, limit=2, newest_first=True)
    rest = store.files(purpose=None, after="file-3", limit=10, newest_first=True)
    oldest = store.files(purpose="batch", after="file-0", limit=10, newest_first=False)

    assert store.file("file-1") == {**a_file("file-1", "batch_output"), "expires_at": None}
    assert ([row["id"] for row in newest.rows], newest.has_more) == (["file-4", "file-3"], True)
    assert ([row["id"] for row in rest.rows], rest.has_more) == (["file-2", "file-1", "file-0"], False)
    assert [row["id"] for row in oldest.rows] == ["file-2", "file-4"]
    assert store.files(purpose=None, after="file-none", limit=10, newest_first=True).rows == []
    assert store.delete_file("file-2") and not store.delete_file("file-2")
    assert store.file("file-2") is None and store.file_ids() == {"file-0", "file-1", "file-3", "file-4"}


def test_batches_are_kept_listed_newest_first_and_found_by_status(replica: StoreFactory) -> None:
    store = replica()
    for n in range(3):
        store.insert_batch(a_batch(f"batch_{n}", status="validating", metadata={"n": str(n)}))
    store.update_batch(moved(store.batch("batch_1"), "failed"))

    first = store.batches(after=None, limit=2)
    second = store.batches(after="batch_1", limit=2)

    assert store.batch("batch_0")["metadata"] == {"n": "0"} and store.batch("batch_1")["status"] == "failed"
    assert store.batch("batch_none") is None
    assert ([batch["id"] for batch in first.rows], first.has_more) == (["batch_2", "batch_1"], True)
    assert ([batch["id"] for batch in second.rows], second.has_more) == (["batch_0"], False)
    assert [batch["id"] for batch in store.batches_in(["validating"])] == ["batch_0", "batch_2"]  # oldest first
    assert store.batches_reading("file-in", ["validating"]) == ["batch_0", "batch_2"]
    assert "owner" not in store.batch("batch_0")  # the lease is the store's, never in the object clients read


def test_a_line_recorded_twice_is_kept_and_counted_once_even_in_a_large_chunk(replica: StoreFactory) -> None:
    store = replica()
    store.insert_batch(a_batch(total=1203))
    many = [FinishedLine(n, n % 3 != 0, {"n": n}, 2, 1) for n in range(1, 1201)]  # over one INSERT's rows

    store.record_lines("batch_1", many[:10])
    batch = store.record_lines("batch_1", [*many, FinishedLine(5, False, {"again": 5}), FinishedLine(1201, True, {})])

    assert batch is not None and batch["request_counts"] == {"total": 1203, "completed": 801, "failed": 400}
    assert batch["usage"]["input_tokens"] == 2 * 1200 and batch["usage"]["total_tokens"] == 3 * 1200
    assert store.batch("batch_1") == batch
    assert store.answered_lines("batch_1") == set(range(1, 1202))
    assert [line for line in store.outputs("batch_1", ok=False)][:2] == ['{"n": 3}', '{"n": 6}']  # in line order
    assert '{"again": 5}' not in list(store.outputs("batch_1", ok=False))
    assert store.record_lines("batch_none", many[:1]) is None


def test_a_change_is_one_transaction_with_its_files_and_rolls_back_whole(replica: StoreFactory) -> None:
    store = replica()
    store.insert_batch(a_batch())

    unchanged = store.change_batch("batch_1", lambda batch: None, files=[a_file("file-unused")])
    changed = store.change_batch("batch_1", lambda batch: moved(batch, "finalizing"), files=[a_file("file-out")])
    with pytest.raises(ValueError, match="cannot go from finalizing to cancelling"):
        store.change_batch("batch_1", lambda batch: moved(batch, "cancelling"), files=[a_file("file-other")])

    assert unchanged == store.batch("batch_1") | {"status": "in_progress", "finalizing_at": None}
    assert changed == store.batch("batch_1") and changed["status"] == "finalizing"
    assert store.file_ids() == {"file-out"}  # neither the files of no change nor those of a failed one
    assert store.change_batch("batch_none", lambda batch: batch) is None


def test_two_replicas_changing_one_batch_at_once_lose_no_update(replica: StoreFactory) -> None:
    stores = [replica(), replica()]
    stores[0].insert_batch(a_batch(metadata={"n": "0"}))

    def bump(store: Store) -> None:
        for _ in range(15):
            store.change_batch(
                "batch_1", lambda b: {**b, "metadata": {"n": str(int(b["metadata"]["n"]) + 1)}}, fenced=False
            )

    threads = [threading.Thread(target=bump, args=(store,)) for store in stores for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert stores[1].batch("batch_1")["metadata"] == {"n": "60"}


# -- leases ----------------------------------------------------------------------------------------


def test_the_creating_replica_owns_a_batch_and_only_its_writes_are_taken(replica: StoreFactory) -> None:
    mine, other = replica(), replica()
    mine.insert_batch(a_batch())

    lease = other.lease("batch_1")
    # The database's clock arithmetic may round a hair over the lease (0.40000009536743164 was seen).
    assert lease is not None and lease.owner == mine.owner and 0 < lease.seconds_left <= LEASE_S + 0.001
    assert not other.claim("batch_1") and other.claim_lapsed() == [] and other.renew() == {}
    with pytest.raises(LeaseLost):
        other.record_lines("batch_1", [FinishedLine(1, True, {})])
    with pytest.raises(LeaseLost):
        other.change_batch("batch_1", lambda batch: moved(batch, "finalizing"))
    cancelled = other.change_batch("batch_1", lambda batch: moved(batch, "cancelling"), fenced=False)  # any replica
    assert mine.record_lines("batch_1", [FinishedLine(1, True, {})])["request_counts"]["completed"] == 1
    assert cancelled["status"] == "cancelling" and mine.renew() == {"batch_1": "cancelling"}
    assert mine.claim("batch_1")  # its own: renewed


def test_a_lapsed_lease_is_taken_over_and_the_old_owner_is_fenced_off(replica: StoreFactory) -> None:
    old, new = replica(), replica()
    old.insert_batch(a_batch())
    old.record_lines("batch_1", [FinishedLine(1, True, {})])

    lapse()
    claimed = new.claim_lapsed()

    assert claimed == ["batch_1"] and new.lease("batch_1").owner == new.owner
    assert old.renew() == {} and new.renew() == {"batch_1": "in_progress"}
    with pytest.raises(LeaseLost):
        old.record_lines("batch_1", [FinishedLine(2, True, {})])
    with pytest.raises(LeaseLost):
        old.change_batch("batch_1", lambda batch: moved(batch, "finalizing"))
    assert not old.claim("batch_1")  # the new owner renewed it
    assert new.record_lines("batch_1", [FinishedLine(2, True, {})])["request_counts"]["completed"] == 2


def test_of_replicas_claiming_a_lapsed_batch_at_once_exactly_one_wins(replica: StoreFactory) -> None:
    stores = [replica() for _ in range(4)]
    for n in range(6):
        stores[0].insert_batch(a_batch(f"batch_{n}"))
    lapse()
    won: dict[str, list[str]] = {}
    start = threading.Barrier(len(stores))

    def race(store: Store) -> None:
        start.wait()
        won[store.owner] = [f"batch_{n}" for n in range(6) if store.claim(f"batch_{n}")]

    threads = [threading.Thread(target=race, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(batch_id for ids in won.values() for batch_id in ids) == [f"batch_{n}" for n in range(6)]
    for n in range(6):
        winner = [owner for owner, ids in won.items() if f"batch_{n}" in ids]
        assert stores[0].lease(f"batch_{n}").owner == winner[0]


def test_released_and_finished_batches(replica: StoreFactory) -> None:
    stopping, other = replica(lease_s=60), replica()
    stopping.insert_batch(a_batch("batch_open"))
    stopping.insert_batch(a_batch("batch_done"))
    stopping.change_batch("batch_done", lambda batch: moved(moved(batch, "finalizing"), "completed"))

    assert stopping.release() == 2
    assert other.claimable() == ["batch_open"]  # a finished batch is never claimed
    assert other.claim_lapsed() == ["batch_open"] and not other.claim("batch_done")
    assert stopping.claim_lapsed(force=True) == ["batch_open"]  # force: whoever holds it
    assert other.renew() == {}


def test_a_database_made_before_leases_gets_its_columns_and_its_batches_are_claimable(tmp_path: Path) -> None:
    path = tmp_path / "server.db"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.execute("INSERT INTO batches (id, data) VALUES (?, ?)", ("batch_old", json.dumps(a_batch("batch_old"))))
    old.execute("INSERT INTO batch_lines VALUES ('batch_old', 1, 1, '{}')")
    old.commit()
    old.close()

    store = Store(path, lease_s=LEASE_S)
    try:
        assert store.lease("batch_old") == Lease(None, None)
        assert store.batches_in(["in_progress"])[0]["id"] == "batch_old"
        assert store.claim_lapsed() == ["batch_old"]
        assert (
            store.record_lines("batch_old", [FinishedLine(1, True, {}), FinishedLine(2, True, {})])["request_counts"][
                "completed"
            ]
            == 1
        )
    finally:
        store.close()


OLD_SCHEMA = """
CREATE TABLE files (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, filename TEXT NOT NULL,
    purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER);
CREATE TABLE batches (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, data TEXT NOT NULL);
CREATE TABLE batch_lines (batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, output TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)) WITHOUT ROWID;
"""
"""The schema of the store before leases (SQLite only: PostgreSQL came with them)."""


def test_database_urls_and_what_logs_show_of_them() -> None:
    assert engine_url(Path("/data/server.db")) == "sqlite:////data/server.db"
    assert engine_url("postgresql://u:secret@db:5432/jobs") == "postgresql+psycopg://u:secret@db:5432/jobs"
    assert engine_url("postgres://u@db/jobs") == "postgresql+psycopg://u@db/jobs"
    assert engine_url("postgresql+psycopg://u@db/jobs") == "postgresql+psycopg://u@db/jobs"
    with pytest.raises(ValueError, match="only sqlite:// and postgresql://"):
        engine_url("mysql://u@db/jobs")
    assert "secret" not in shown_url(engine_url("postgresql://u:secret@db:5432/jobs"))
    settings = ServerSettings(database_url="postgresql://u:secret@db/jobs")
    assert "secret" not in repr(settings)
    assert ServerSettings.from_environment(settings.environment()) == settings


def test_leftovers_are_removed_at_once_alone_and_only_once_stale_when_shared(
    replica: StoreFactory, tmp_path: Path
) -> None:
    folder = tmp_path / "files"
    files = FileStore(folder, replica(), max_bytes=2**20)
    for name in (".upload-fresh", "file-fresh", ".upload-stale", "file-stale"):
        (folder / name).write_text("{}")
    for name in (".upload-stale", "file-stale"):
        os.utime(folder / name, (time.time() - 3600, time.time() - 3600))

    assert files.remove_leftovers(older_than_s=900) == 2
    assert sorted(path.name for path in folder.iterdir()) == [".upload-fresh", "file-fresh"]
    assert files.remove_leftovers() == 2 and list(folder.iterdir()) == []


# -- the runner and the lease keeper ---------------------------------------------------------------


class WaitingExecutor:
    """Answers no line: waits until the batch is cancelled (a batch in the middle of its lines)."""

    async def answer(self, batch: dict[str, Any], *, cancelled: asyncio.Event) -> None:
        await cancelled.wait()


def a_runner(store: Store, folder: Path) -> BatchRunner:
    files = FileStore(folder, store, max_bytes=2**20)
    runner = BatchRunner(store, files, inference=None, settings=ServerSettings())  # type: ignore[arg-type]
    runner.executor = WaitingExecutor()  # type: ignore[assignment]
    return runner


async def test_a_cancel_keeps_the_lines_recorded_while_it_was_being_made(
    replica: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug D: a cancel read the batch, then wrote it whole, losing the counts committed in between."""
    store = replica()
    runner = a_runner(store, tmp_path / "files")
    (tmp_path / "files" / "file-in").write_text('{"custom_id": "a"}\n{"custom_id": "b"}\n{"custom_id": "c"}\n')
    store.insert_batch(a_batch(total=3))
    real_change = store.change_batch
    recorders: list[threading.Thread] = []

    def change_while_lines_are_recorded(batch_id: str, change: Any, **options: Any) -> dict[str, Any] | None:
        def changed(batch: dict[str, Any]) -> dict[str, Any] | None:
            after = change(batch)
            if after is not None and after["status"] == "cancelling":  # between the cancel's read and its write
                answered = [FinishedLine(1, True, {}), FinishedLine(2, True, {})]  # the batch's task records two lines
                recorder = threading.Thread(target=store.record_lines, args=("batch_1", answered))
                recorder.start()
                recorder.join(timeout=1.0)  # the old code let it commit here; now it waits for the cancel's transaction
                recorders.append(recorder)
            return after

        return real_change(batch_id, changed, **options)

    monkeypatch.setattr(store, "change_batch", change_while_lines_are_recorded)

    cancelling = runner.cancel("batch_1")
    for recorder in recorders:
        recorder.join()
    await runner.wait("batch_1")

    ended = store.batch("batch_1")
    assert cancelling["status"] == "cancelling"
    assert ended["status"] == "cancelled" and ended["request_counts"] == {"total": 3, "completed": 2, "failed": 1}


async def test_a_cancel_on_another_replica_stops_the_owners_lines(replica: StoreFactory, tmp_path: Path) -> None:
    owner, other = replica(lease_s=60), replica(lease_s=60)
    runner, elsewhere = a_runner(owner, tmp_path / "files"), a_runner(other, tmp_path / "files")
    (tmp_path / "files" / "file-in").write_text('{"custom_id": "a"}\n{"custom_id": "b"}\n')
    owner.insert_batch(a_batch(total=2))
    runner.start("batch_1")
    await asyncio.sleep(0.1)

    assert elsewhere.cancel("batch_1")["status"] == "cancelling"
    assert elsewhere.running() == set() and owner.batch("batch_1")["status"] == "cancelling"  # the owner's to end
    await LeaseKeeper(owner, runner, interval_s=1).round()  # the owner's keeper sees it, and stops its lines
    await asyncio.wait_for(runner.wait("batch_1"), 10)

    ended = owner.batch("batch_1")
    assert ended["status"] == "cancelled" and ended["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    assert [line.count("batch_cancelled") for line in owner.outputs("batch_1", ok=False)] == [1, 1]


async def test_a_keeper_takes_over_a_lapsed_batch_and_the_old_owner_stops(
    replica: StoreFactory, tmp_path: Path
) -> None:
    old, new = replica(), replica()
    old_runner, new_runner = a_runner(old, tmp_path / "files"), a_runner(new, tmp_path / "files")
    (tmp_path / "files" / "file-in").write_text('{"custom_id": "a"}\n')
    old.insert_batch(a_batch(total=1))
    old_runner.start("batch_1")
    await asyncio.sleep(LEASE_S + 0.2)  # the old owner's keeper is not running: its lease lapses

    claimed = await LeaseKeeper(new, new_runner, interval_s=1).round()
    await LeaseKeeper(old, old_runner, interval_s=1).round()  # the old owner learns it lost the batch
    await asyncio.sleep(0.1)

    assert claimed == ["batch_1"] and new_runner.running() == {"batch_1"}
    assert old_runner.running() == set() and new.lease("batch_1").owner == new.owner
    new_runner.cancel("batch_1")
    await asyncio.wait_for(new_runner.wait("batch_1"), 10)
    assert new.batch("batch_1")["status"] == "cancelled"
