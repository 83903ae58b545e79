"""Spotting a repeated `custom_id` over millions of lines without holding them all in memory."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path


class SeenIds:
    """The ids seen so far, in an on-disk SQLite table (memory stays flat however long the file).

    Args:
        directory: Where the table's file goes (a temporary directory by default).

    Example:
        ```python
        with SeenIds() as seen:
            first_line = seen.add("request-7", line=12)  # None: new; else the line it was first on
        ```
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self._directory = tempfile.TemporaryDirectory(dir=directory, prefix="custom-ids-")
        self._db = sqlite3.connect(Path(self._directory.name) / "ids.sqlite", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE ids (id TEXT PRIMARY KEY, line INTEGER) WITHOUT ROWID")
        self._db.execute("BEGIN")

    def add(self, custom_id: str, line: int) -> int | None:
        """Record `custom_id`; returns `None` if it is new, else the line it was first seen on."""
        inserted = self._db.execute("INSERT OR IGNORE INTO ids VALUES (?, ?)", (custom_id, line)).rowcount
        if inserted:
            return None
        return int(self._db.execute("SELECT line FROM ids WHERE id = ?", (custom_id,)).fetchone()[0])

    def close(self) -> None:
        """Drop the table and its file."""
        self._db.close()
        self._directory.cleanup()

    def __enter__(self) -> SeenIds:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
