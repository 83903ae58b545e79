"""The server's state in SQLite: files, batches, and every answered line of every batch.

A line counts as answered only once its row is committed, in the same transaction as the batch's
counters, so a server killed at any moment (`kill -9`) restarts with a consistent picture: each
line either has its one output row or runs again, and none is answered twice. SQLite's journal
(WAL) makes every commit atomic, so a crash mid-write leaves the last committed state, not a torn one.

All methods are blocking and quick (one small transaction each); they are safe from any thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_lines (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    output TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class LineRecord:
    """One answered line of a batch: its number, whether it succeeded, its output line, its tokens."""

    line: int
    ok: bool
    output: dict[str, Any]
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class Page:
    """A page of a list: its rows, newest or oldest first, and whether more follow."""

    rows: list[dict[str, Any]]
    has_more: bool


class Store:
    """The database at `path` (created with its tables if missing).

    Example:
        ```python
        store = Store(data_dir / "server.db")
        store.insert_batch({"id": "batch_1", "status": "validating", ...})
        ```
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives the process being killed; only a power cut may lose the last ones.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic transaction, serialized with every other use of the store."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- files -------------------------------------------------------------------------------------

    def insert_file(self, row: dict[str, Any]) -> None:
        with self.transaction() as db:
            _insert_file(db, row)

    def file(self, file_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        return _plain(found) if found is not None else None

    def files(self, *, purpose: str | None, after: str | None, limit: int, newest_first: bool) -> Page:
        where, arguments = [], []
        if purpose:
            where.append("purpose = ?")
            arguments.append(purpose)
        return self._page("files", where, arguments, after=after, limit=limit, newest_first=newest_first)

    def delete_file(self, file_id: str) -> bool:
        with self.transaction() as db:
            return db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0

    def file_ids(self) -> set[str]:
        with self._lock:
            return {row[0] for row in self._db.execute("SELECT id FROM files")}

    # -- batches -----------------------------------------------------------------------------------

    def insert_batch(self, batch: dict[str, Any]) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO batches (id, data) VALUES (?, ?)", (batch["id"], json.dumps(batch)))

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._db.execute("SELECT data FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return json.loads(found[0]) if found is not None else None

    def batches(self, *, after: str | None, limit: int) -> Page:
        page = self._page("batches", [], [], after=after, limit=limit, newest_first=True)
        return Page([json.loads(row["data"]) for row in page.rows], page.has_more)

    def batches_in(self, statuses: Sequence[str]) -> list[dict[str, Any]]:
        """Every batch whose status is one of `statuses`, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT data FROM batches ORDER BY seq").fetchall()
        batches = [json.loads(row[0]) for row in rows]
        return [batch for batch in batches if batch["status"] in statuses]

    def update_batch(self, batch: dict[str, Any], *, files: Sequence[dict[str, Any]] = ()) -> None:
        """Store a batch's new state (and the output files it now points to) in one transaction."""
        with self.transaction() as db:
            for row in files:
                _insert_file(db, row)
            db.execute("UPDATE batches SET data = ? WHERE id = ?", (json.dumps(batch), batch["id"]))

    def batches_reading(self, file_id: str, statuses: Sequence[str]) -> list[str]:
        """Ids of the batches in `statuses` that read `file_id`."""
        return [batch["id"] for batch in self.batches_in(statuses) if batch["input_file_id"] == file_id]

    # -- answered lines ----------------------------------------------------------------------------

    def record_lines(self, batch_id: str, records: Sequence[LineRecord]) -> dict[str, Any] | None:
        """Keep answered lines and add them to the batch's counts, in one transaction; returns the batch.

        A line recorded before (a chunk that ran again after a restart) is neither stored nor counted twice.
        """
        with self.transaction() as db:
            found = db.execute("SELECT data FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if found is None:
                return None
            batch = json.loads(found[0])
            counts, usage = batch["request_counts"], batch["usage"]
            for record in records:
                inserted = db.execute(
                    "INSERT OR IGNORE INTO batch_lines (batch_id, line, ok, output) VALUES (?, ?, ?, ?)",
                    (batch_id, record.line, int(record.ok), json.dumps(record.output, ensure_ascii=False)),
                ).rowcount
                if inserted:
                    counts["completed" if record.ok else "failed"] += 1
                    usage["input_tokens"] += record.input_tokens
                    usage["output_tokens"] += record.output_tokens
            usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
            db.execute("UPDATE batches SET data = ? WHERE id = ?", (json.dumps(batch), batch_id))
        return batch

    def answered_lines(self, batch_id: str) -> set[int]:
        """The numbers of the lines of a batch that have their output."""
        with self._lock:
            rows = self._db.execute("SELECT line FROM batch_lines WHERE batch_id = ?", (batch_id,)).fetchall()
        return {row[0] for row in rows}

    def outputs(self, batch_id: str, *, ok: bool) -> Iterator[str]:
        """A batch's result lines (`ok`) or error lines, as JSON text, in input order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT output FROM batch_lines WHERE batch_id = ? AND ok = ? ORDER BY line", (batch_id, int(ok))
            ).fetchall()
        for row in rows:
            yield row[0]

    # -- internals ---------------------------------------------------------------------------------

    def _page(
        self, table: str, where: list[str], arguments: list[Any], *, after: str | None, limit: int, newest_first: bool
    ) -> Page:
        """Up to `limit` rows after the row with id `after`, in `seq` order (newest first or oldest first)."""
        order, compare = ("DESC", "<") if newest_first else ("ASC", ">")
        with self._lock:
            if after is not None:
                cursor = self._db.execute(f"SELECT seq FROM {table} WHERE id = ?", (after,)).fetchone()
                if cursor is None:
                    return Page([], False)
                where, arguments = [*where, f"seq {compare} ?"], [*arguments, cursor[0]]
            clause = f"WHERE {' AND '.join(where)}" if where else ""
            rows = self._db.execute(
                f"SELECT * FROM {table} {clause} ORDER BY seq {order} LIMIT ?", (*arguments, limit + 1)
            ).fetchall()
        return Page([_plain(row) for row in rows[:limit]], len(rows) > limit)


def _insert_file(db: sqlite3.Connection, row: dict[str, Any]) -> None:
    db.execute(
        "INSERT INTO files (id, filename, purpose, bytes, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
        (row["id"], row["filename"], row["purpose"], row["bytes"], row["created_at"], row.get("expires_at")),
    )


def _plain(row: sqlite3.Row) -> dict[str, Any]:
    return {key: row[key] for key in row.keys() if key != "seq"}  # noqa: SIM118 (sqlite3.Row iterates values)
