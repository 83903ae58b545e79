"""The server's state in a database: files, batches, every answered line of every batch, and who runs each batch.

SQLAlchemy Core over SQLite (the embedded default, `<data dir>/server.db`, in WAL mode) or
PostgreSQL (`--database-url postgresql://...`, through psycopg), which several server replicas share.

A line counts as answered only once its row is committed, in the same transaction as the batch's
counters, so a server killed at any moment (`kill -9`) restarts with a consistent picture: each
line either has its one output row or runs again, and none is answered twice. Every change of a
batch is a read-modify-write in one transaction that locks the batch's row (`SELECT ... FOR UPDATE`
on PostgreSQL; SQLite's `BEGIN IMMEDIATE` serializes every writer), so no write loses another's.

**Leases.** Each unfinished batch has an owner (the `owner` of the `Store` that runs it: one per
server process) and a lease that expires `lease_s` after it was last renewed, both kept in columns
of their own (never in the batch's object, which clients read). The owner's writes are fenced: a
store that no longer owns a batch (another took it over when its lease expired) gets `LeaseLost`
instead of writing, so no line is answered twice. Lease times are the database's clock, so the
replicas' clocks need not agree.

All methods are blocking and quick (one small transaction each); they are safe from any thread.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from flyteplugins_batcher import BatcherError
from flyteplugins_batcher.replica import FinishedLine
from flyteplugins_batcher.server._state.statuses import ACTIVE

metadata = sa.MetaData()

files_table = sa.Table(
    "files",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.Text, unique=True, nullable=False),
    sa.Column("filename", sa.Text, nullable=False),
    sa.Column("purpose", sa.Text, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.BigInteger),
    sqlite_autoincrement=True,
)
batches_table = sa.Table(
    "batches",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.Text, unique=True, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    # Added after the first schema (`_migrate` adds them to an older database): kept beside `data`.
    sa.Column("status", sa.Text),
    sa.Column("owner", sa.Text),
    sa.Column("lease_expires_at", sa.Float),
    sqlite_autoincrement=True,
)
batches_by_status = sa.Index("batches_by_status", batches_table.c.status)
lines_table = sa.Table(
    "batch_lines",
    metadata,
    sa.Column("batch_id", sa.Text, primary_key=True),
    sa.Column("line", sa.Integer, primary_key=True),
    sa.Column("ok", sa.Integer, nullable=False),
    sa.Column("output", sa.Text, nullable=False),
    sqlite_with_rowid=False,
)

_LATER_COLUMNS = {"status": "TEXT", "owner": "TEXT", "lease_expires_at": "FLOAT"}
_INSERT_ROWS = 500
"""Rows per INSERT statement when recording lines (SQLite takes at most 32,766 parameters in one)."""
_SCHEMA_LOCK = 7_310_517_223
"""The PostgreSQL advisory lock held while a replica creates or migrates the tables."""


class LeaseLost(BatcherError):
    """This store no longer owns the batch it wrote to (another server took it over): the write was refused."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(f"batch {batch_id} is no longer run by this server")
        self.batch_id = batch_id


@dataclass(frozen=True)
class Page:
    """A page of a list: its rows, newest or oldest first, and whether more follow."""

    rows: list[dict[str, Any]]
    has_more: bool


@dataclass(frozen=True)
class Lease:
    """Who runs a batch (`None`: nobody), and the seconds until that claim lapses (negative once it has)."""

    owner: str | None
    seconds_left: float | None


def engine_url(target: str | Path) -> str:
    """The SQLAlchemy URL for a database: a path is an SQLite file; `postgresql://` is PostgreSQL through psycopg.

    Raises:
        ValueError: A URL of another database than SQLite and PostgreSQL.
    """
    text = str(target)
    if isinstance(target, Path) or "://" not in text:
        return f"sqlite:///{text}"
    scheme, rest = text.split("://", 1)
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return f"postgresql+psycopg://{rest}"
    if scheme in ("sqlite", "sqlite+pysqlite"):
        return text
    raise ValueError(f"database_url: only sqlite:// and postgresql:// databases are supported, got {scheme}://")


def shown_url(url: str) -> str:
    """A database URL as logs may show it: its password masked."""
    return sa.make_url(url).render_as_string(hide_password=True)


class Store:
    """The database at `target` (an SQLite file, or a URL), created with its tables if missing.

    Args:
        target: A path (an SQLite file; its folder is created) or a database URL (`engine_url`).
        owner: This server's id, written as the owner of the batches it runs; `None`: a new random one.
        lease_s: How long a claim on a batch lasts without being renewed.

    Example:
        ```python
        store = Store(data_dir / "server.db")
        store.insert_batch({"id": "batch_1", "status": "validating", ...})
        ```
    """

    def __init__(self, target: str | Path, *, owner: str | None = None, lease_s: float = 15.0) -> None:
        url = engine_url(target)
        self.url = url
        self.owner = owner or secrets.token_hex(8)
        self.lease_s = lease_s
        self.engine = _engine(url)
        self.dialect = self.engine.dialect.name
        # SQLite has one writer at a time: in this process they queue here rather than in SQLite's busy loop.
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else nullcontext()
        with self.transaction() as db:
            _create_tables(db)

    @property
    def path(self) -> Path | None:
        """The SQLite file, for a store that is one."""
        database = sa.make_url(self.url).database
        return Path(database) if self.dialect == "sqlite" and database else None

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One atomic read-write transaction (`BEGIN IMMEDIATE` on SQLite), committed when the block ends."""
        with self._write_lock, self.engine.connect() as db:
            db.execution_options(immediate=True)
            with db.begin():
                yield db

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        with self.engine.connect() as db:
            yield db

    def close(self) -> None:
        self.engine.dispose()

    # -- files -------------------------------------------------------------------------------------

    def insert_file(self, row: dict[str, Any]) -> None:
        with self.transaction() as db:
            _insert_file(db, row)

    def file(self, file_id: str) -> dict[str, Any] | None:
        with self._reading() as db:
            found = db.execute(sa.select(files_table).where(files_table.c.id == file_id)).mappings().first()
        return _plain(found) if found is not None else None

    def files(self, *, purpose: str | None, after: str | None, limit: int, newest_first: bool) -> Page:
        where = [files_table.c.purpose == purpose] if purpose else []
        return self._page(files_table, where, after=after, limit=limit, newest_first=newest_first)

    def delete_file(self, file_id: str) -> bool:
        with self.transaction() as db:
            return db.execute(sa.delete(files_table).where(files_table.c.id == file_id)).rowcount > 0

    def file_ids(self) -> set[str]:
        with self._reading() as db:
            return set(db.execute(sa.select(files_table.c.id)).scalars())

    # -- batches -----------------------------------------------------------------------------------

    def insert_batch(self, batch: dict[str, Any]) -> None:
        """Keep a new batch; this store owns it (its lease starts now)."""
        row = {"id": batch["id"], "data": json.dumps(batch), "status": batch["status"], "owner": self.owner}
        with self.transaction() as db:
            db.execute(sa.insert(batches_table).values(**row, lease_expires_at=self._lease_end()))

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        with self._reading() as db:
            found = db.execute(sa.select(batches_table.c.data).where(batches_table.c.id == batch_id)).scalar()
        return json.loads(found) if found is not None else None

    def batches(self, *, after: str | None, limit: int) -> Page:
        page = self._page(batches_table, [], after=after, limit=limit, newest_first=True)
        return Page([json.loads(row["data"]) for row in page.rows], page.has_more)

    def batches_in(self, statuses: Sequence[str]) -> list[dict[str, Any]]:
        """Every batch whose status is one of `statuses`, oldest first."""
        query = sa.select(batches_table.c.data).where(batches_table.c.status.in_(list(statuses)))
        with self._reading() as db:
            rows = db.execute(query.order_by(batches_table.c.seq)).scalars().all()
        return [json.loads(data) for data in rows]

    def update_batch(self, batch: dict[str, Any], *, files: Sequence[dict[str, Any]] = ()) -> None:
        """Store a batch's new state (and the output files it now points to) in one transaction, whoever owns it.

        It overwrites what another writer committed since `batch` was read: `change_batch` is the safe way.
        """
        with self.transaction() as db:
            for row in files:
                _insert_file(db, row)
            _write_batch(db, batch)

    def change_batch(
        self,
        batch_id: str,
        change: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        files: Sequence[dict[str, Any]] = (),
        fenced: bool = True,
    ) -> dict[str, Any] | None:
        """Change a batch in one transaction that holds its row: `change` gets it as committed, returns the new one.

        Args:
            batch_id: The batch.
            change: Given the batch's current object, its new object, or `None` to leave it as it is.
                It runs inside the transaction: quick, and no I/O. What it raises rolls it back.
            files: Rows of files (the batch's outputs) committed with the change, when there is one.
            fenced: Only while this store owns the batch (the writes of the server that runs it); off
                for a request any server may take (a cancel).

        Returns:
            The batch after the change (unchanged when `change` returned `None`); `None` for no such batch.

        Raises:
            LeaseLost: `fenced`, and another store runs the batch now.
        """
        with self.transaction() as db:
            current = self._held(db, batch_id, fenced=fenced)
            if current is None:
                return None
            changed = change(current)
            if changed is None:
                return current
            for row in files:
                _insert_file(db, row)
            _write_batch(db, changed)
        return changed

    def batches_reading(self, file_id: str, statuses: Sequence[str]) -> list[str]:
        """Ids of the batches in `statuses` that read `file_id`."""
        return [batch["id"] for batch in self.batches_in(statuses) if batch["input_file_id"] == file_id]

    # -- answered lines ----------------------------------------------------------------------------

    def record_lines(self, batch_id: str, records: Sequence[FinishedLine]) -> dict[str, Any] | None:
        """Keep answered lines and add them to the batch's counts, in one transaction; returns the batch.

        A line recorded before (a chunk that ran again after a restart) is neither stored nor counted twice.

        Raises:
            LeaseLost: Another store runs the batch now: nothing is recorded.
        """
        with self.transaction() as db:
            batch = self._held(db, batch_id, fenced=True)
            if batch is None:
                return None
            inserted = _insert_lines(db, batch_id, records)
            counts, usage = batch["request_counts"], batch["usage"]
            details = usage.setdefault("input_tokens_details", {"cached_tokens": 0})
            for record in records:
                if record.line in inserted:
                    inserted.discard(record.line)  # the first of two records for one line is the one kept
                    counts["completed" if record.ok else "failed"] += 1
                    usage["input_tokens"] += record.input_tokens
                    usage["output_tokens"] += record.output_tokens
                    details["cached_tokens"] += record.cached_tokens
            usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
            _write_batch(db, batch)
        return batch

    def answered_lines(self, batch_id: str) -> set[int]:
        """The numbers of the lines of a batch that have their output."""
        with self._reading() as db:
            return set(db.execute(sa.select(lines_table.c.line).where(lines_table.c.batch_id == batch_id)).scalars())

    def outputs(self, batch_id: str, *, ok: bool) -> Iterator[str]:
        """A batch's result lines (`ok`) or error lines, as JSON text, in input order."""
        query = sa.select(lines_table.c.output).where(lines_table.c.batch_id == batch_id, lines_table.c.ok == int(ok))
        with self._reading() as db:
            rows = db.execute(query.order_by(lines_table.c.line)).scalars().all()
        yield from rows

    # -- leases ------------------------------------------------------------------------------------

    def claim(self, batch_id: str, *, force: bool = False) -> bool:
        """Take an unfinished batch if nobody holds it, its lease has lapsed, or this store holds it (renewed).

        One UPDATE that checks and sets at once, so of two stores claiming together one wins.

        Args:
            batch_id: The batch.
            force: Take it whoever holds it (the embedded database's only server, starting again).

        Returns:
            Whether this store owns the batch now.
        """
        free = sa.or_(
            batches_table.c.owner.is_(None),
            batches_table.c.owner == self.owner,
            batches_table.c.lease_expires_at < self._clock(),
        )
        where = [batches_table.c.id == batch_id, batches_table.c.status.in_(ACTIVE)]
        with self.transaction() as db:
            taken = sa.update(batches_table).where(*where, *([] if force else [free]))
            return db.execute(taken.values(owner=self.owner, lease_expires_at=self._lease_end())).rowcount > 0

    def claimable(self) -> list[str]:
        """Unfinished batches nobody holds, or whose lease has lapsed (this store's own included), oldest first."""
        lapsed = sa.or_(batches_table.c.owner.is_(None), batches_table.c.lease_expires_at < self._clock())
        query = sa.select(batches_table.c.id).where(batches_table.c.status.in_(ACTIVE), lapsed)
        with self._reading() as db:
            return list(db.execute(query.order_by(batches_table.c.seq)).scalars())

    def claim_lapsed(self, *, force: bool = False) -> list[str]:
        """Claim every claimable batch (`force`: every unfinished one); returns those this store took, oldest first."""
        candidates = self.claimable() if not force else [batch["id"] for batch in self.batches_in(ACTIVE)]
        return [batch_id for batch_id in candidates if self.claim(batch_id, force=force)]

    def renew(self) -> dict[str, str]:
        """Extend the lease on every unfinished batch this store owns; returns them, with their statuses."""
        mine = [batches_table.c.owner == self.owner, batches_table.c.status.in_(ACTIVE)]
        with self.transaction() as db:
            db.execute(sa.update(batches_table).where(*mine).values(lease_expires_at=self._lease_end()))
            rows = db.execute(sa.select(batches_table.c.id, batches_table.c.status).where(*mine)).all()
        return {row.id: row.status for row in rows}

    def release(self) -> int:
        """Give up every batch this store owns (a server stopping), for another to claim at once; returns how many."""
        with self.transaction() as db:
            released = sa.update(batches_table).where(batches_table.c.owner == self.owner)
            return db.execute(released.values(owner=None, lease_expires_at=None)).rowcount

    def lease(self, batch_id: str) -> Lease | None:
        """Who holds a batch, and for how long yet; `None` for no such batch."""
        left = batches_table.c.lease_expires_at - self._clock()
        query = sa.select(batches_table.c.owner, left).where(batches_table.c.id == batch_id)
        with self._reading() as db:
            found = db.execute(query).first()
        return Lease(found[0], found[1]) if found is not None else None

    # -- internals ---------------------------------------------------------------------------------

    def _held(self, db: Connection, batch_id: str, *, fenced: bool) -> dict[str, Any] | None:
        """A batch read with its row locked to the end of the transaction; fenced: only if this store owns it."""
        query = sa.select(batches_table.c.data, batches_table.c.owner).where(batches_table.c.id == batch_id)
        found = db.execute(query.with_for_update()).first()
        if found is None:
            return None
        if fenced and found.owner != self.owner:
            raise LeaseLost(batch_id)
        return json.loads(found.data)

    def _clock(self) -> sa.ColumnElement[float]:
        """The database's time now, in seconds since the epoch (one clock for every replica)."""
        if self.dialect == "postgresql":
            return sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Float)
        return (sa.func.julianday("now") - 2440587.5) * 86400.0

    def _lease_end(self) -> sa.ColumnElement[float]:
        return self._clock() + self.lease_s

    def _page(self, table: sa.Table, where: list[Any], *, after: str | None, limit: int, newest_first: bool) -> Page:
        """Up to `limit` rows after the row with id `after`, in `seq` order (newest first or oldest first)."""
        seq = table.c.seq
        with self._reading() as db:
            if after is not None:
                cursor = db.execute(sa.select(seq).where(table.c.id == after)).scalar()
                if cursor is None:
                    return Page([], False)
                where = [*where, seq < cursor if newest_first else seq > cursor]
            query = sa.select(table).where(*where).order_by(seq.desc() if newest_first else seq.asc())
            rows = db.execute(query.limit(limit + 1)).mappings().all()
        return Page([_plain(row) for row in rows[:limit]], len(rows) > limit)


def _engine(url: str) -> Engine:
    """An engine for `url`: SQLite in WAL mode with its transactions begun by hand, or PostgreSQL through psycopg."""
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=16)
    database = sa.make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 60.0})

    @sa.event.listens_for(engine, "connect")
    def _connected(connection: Any, _record: Any) -> None:
        connection.isolation_level = None  # the driver begins nothing itself: `_begin` does
        connection.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives the process being killed; only a power cut may lose the last ones.
        connection.execute("PRAGMA synchronous=NORMAL")

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get("immediate")
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _create_tables(db: Connection) -> None:
    """Create the tables that are missing, and add to an older database the columns it lacks."""
    if db.dialect.name == "postgresql":  # replicas starting together: one creates, the others wait, then see them
        db.execute(sa.select(sa.func.pg_advisory_xact_lock(_SCHEMA_LOCK)))
    metadata.create_all(db)
    _migrate(db)
    batches_by_status.create(db, checkfirst=True)


def _migrate(db: Connection) -> None:
    """A database made before leases: add `status`, `owner` and `lease_expires_at`; fill `status` from each batch."""
    present = {column["name"] for column in sa.inspect(db).get_columns("batches")}
    for name, kind in _LATER_COLUMNS.items():
        if name not in present:
            db.exec_driver_sql(f"ALTER TABLE batches ADD COLUMN {name} {kind}")
    missing = db.execute(sa.select(batches_table.c.id, batches_table.c.data).where(batches_table.c.status.is_(None)))
    for row in missing.all():
        status = json.loads(row.data)["status"]
        db.execute(sa.update(batches_table).where(batches_table.c.id == row.id).values(status=status))


def _write_batch(db: Connection, batch: dict[str, Any]) -> None:
    changed = sa.update(batches_table).where(batches_table.c.id == batch["id"])
    db.execute(changed.values(data=json.dumps(batch), status=batch["status"]))


def _insert_file(db: Connection, row: dict[str, Any]) -> None:
    columns = ("id", "filename", "purpose", "bytes", "created_at")
    db.execute(sa.insert(files_table).values(**{key: row[key] for key in columns}, expires_at=row.get("expires_at")))


def _insert_lines(db: Connection, batch_id: str, records: Sequence[FinishedLine]) -> set[int]:
    """Insert the lines not recorded before (`ON CONFLICT DO NOTHING`); returns the numbers of those inserted."""
    insert = postgresql.insert if db.dialect.name == "postgresql" else sqlite.insert
    rows = [
        {"batch_id": batch_id, "line": r.line, "ok": int(r.ok), "output": json.dumps(r.output, ensure_ascii=False)}
        for r in records
    ]
    inserted: set[int] = set()
    for start in range(0, len(rows), _INSERT_ROWS):
        statement = insert(lines_table).values(rows[start : start + _INSERT_ROWS]).on_conflict_do_nothing()
        inserted.update(db.execute(statement.returning(lines_table.c.line)).scalars())
    return inserted


def _plain(row: Any) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key != "seq"}


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: `file-...`, `batch_...`."""
    return f"{prefix}{secrets.token_hex(12)}"
