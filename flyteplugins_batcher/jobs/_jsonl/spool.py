"""`Spool`: requests set aside on disk, per base model, until that model's turn comes.

A file whose lines name several base models is read once: the first model's lines run as they are
read, and the others' parsed requests wait here (pickled, in a temporary folder of the job's), so
that the driver's memory does not grow with the file, a bad line is reported once, and a
`custom_id` is checked against the whole file. Each model's requests come back in file order.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from flyteplugins_batcher.batch_api import ParsedRequest


class Spool:
    """Requests kept on disk by lane (a base model), read back lane by lane in the order they were added.

    Args:
        folder: Where its temporary folder goes.

    Example:
        ```python
        spool = Spool(work_folder)
        spool.add("org/model-b", request)
        for request in spool.take("org/model-b"):  # file order; the lane's file is removed once read
            ...
        spool.close()
        ```
    """

    def __init__(self, folder: Path) -> None:
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._parent = folder
        self._files: dict[str, tuple[Path, IO[bytes]]] = {}

    @property
    def lanes(self) -> list[str]:
        """The lanes that hold requests, in the order their first request came."""
        return list(self._files)

    def add(self, lane: str, request: ParsedRequest) -> None:
        """Keep `request` on disk until its lane is taken."""
        if lane not in self._files:
            if self._folder is None:
                self._folder = tempfile.TemporaryDirectory(dir=self._parent, prefix="spool-")
            path = Path(self._folder.name) / f"{len(self._files)}.pickle"
            self._files[lane] = (path, path.open("wb"))
        pickle.dump(request, self._files[lane][1], protocol=pickle.HIGHEST_PROTOCOL)

    def take(self, lane: str) -> Iterator[ParsedRequest]:
        """The lane's requests, in the order they were added (it is emptied: its file goes once read through)."""
        path, handle = self._files.pop(lane)
        handle.close()
        try:
            with path.open("rb") as requests:
                while True:
                    try:
                        yield pickle.load(requests)
                    except EOFError:
                        return
        finally:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove whatever is left."""
        for _, handle in self._files.values():
            handle.close()
        self._files.clear()
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
