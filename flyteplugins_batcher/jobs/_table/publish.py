"""Where a table job's output dataset goes: checked before any inference, its parts published at the end.

The output is a folder of Parquet parts (`part-*.parquet`): a local folder, an object-store prefix,
or (neither given) a folder of the run's own Flyte storage. A folder that holds other files is
refused before anything runs, since reading it would mix them into the table; parts of an earlier
run there are replaced, and those the new run does not write are removed. Until the end the parts
are in the run's work folder; if publishing fails, they stay there and the error names it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from flyteplugins_batcher.jobs._outputs import Destination, OutputDirError, PublishError, WorkFolder, _local_run_storage

_PART = re.compile(r"^part-\d+\.parquet$")


def check_output(output_dir: str) -> Destination:
    """The destination of the output dataset, checked now: a local folder is created and must hold only parts.

    Raises:
        OutputDirError: A file where the folder should be, a folder that cannot be written, a scheme Flyte
            cannot write to, or a folder (or prefix) holding files that are not this job's parts.
    """
    destination = Destination.check(output_dir)
    if destination.folder is not None:
        _refuse_foreign(output_dir, [path.name for path in destination.folder.iterdir()])
    elif destination.uri is not None:
        _refuse_foreign(output_dir, _remote_names(destination.uri))
    return destination


async def publish_parts(parts: list[Path], work: WorkFolder) -> str:
    """Publish the parts to the work folder's destination; the output dataset's URI (or local path).

    Raises:
        PublishError: Publishing failed; the parts are still in the work folder, which the message names.
    """
    destination = work.destination
    try:
        if destination.folder is not None:
            where = _copy_parts(parts, destination.folder)
        else:
            where = await _upload_parts(parts, destination.uri)
    except Exception as error:
        raise PublishError(
            f"could not publish to {destination.describe()} ({error}); the parts are in {work.path}"
        ) from error
    if where != str(work.path):
        work.discard()
    return where


def _refuse_foreign(output_dir: str, names: list[str]) -> None:
    # Readers skip names starting with "." or "_" (a part left half-copied, say).
    foreign = sorted(name for name in names if not _PART.match(name) and not name.startswith((".", "_")))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputDirError(
            f"output {output_dir!r} holds files that are not this job's parts ({shown}): the table written there would "
            "mix with them. Give an empty or new folder."
        )


def _remote_names(uri: str) -> list[str]:
    """The names under an object-store prefix (none where it does not exist yet)."""
    filesystem = _filesystem(uri)
    try:
        return [name.rstrip("/").rsplit("/", 1)[-1] for name in filesystem.ls(uri, detail=False)]
    except FileNotFoundError:
        return []


def _filesystem(uri: str) -> Any:
    import flyte.storage

    return flyte.storage.get_underlying_filesystem(path=uri)


def _copy_parts(parts: list[Path], folder: Path) -> str:
    """Copy the parts into a local folder, then remove an earlier run's parts that this run did not write."""
    for part in parts:
        shutil.copyfile(part, folder / f".{part.name}.partial")
        (folder / f".{part.name}.partial").replace(folder / part.name)
    written = {part.name for part in parts}
    for stale in folder.iterdir():
        if _PART.match(stale.name) and stale.name not in written:
            stale.unlink()
    return str(folder)


async def _upload_parts(parts: list[Path], uri: str | None) -> str:
    """Upload the parts under `uri` (removing an earlier run's parts it did not write), or to the run's storage."""
    if uri is None:
        return await _to_run_storage(parts)
    await _put(parts, uri)
    filesystem = _filesystem(uri)
    written = {part.name for part in parts}
    for name in _remote_names(uri):
        if _PART.match(name) and name not in written:
            filesystem.rm(f"{uri}/{name}")
    return uri


async def _to_run_storage(parts: list[Path]) -> str:
    """The parts in a fresh folder of the run's storage (kept in the work folder outside a Flyte task)."""
    import flyte

    local = _local_run_storage()
    if local is not None:  # a --local run: its raw-data folder on this machine
        return _copy_parts(parts, _created(Path(local.get_random_remote_path("table"))))
    context = flyte.ctx()
    if context is None or context.raw_data_path is None:
        return str(parts[0].parent)
    uri = str(context.raw_data_path.get_random_remote_path("table"))
    await _put(parts, uri)
    return uri


async def _put(parts: list[Path], uri: str) -> None:
    import flyte.storage

    for part in parts:
        await flyte.storage.put(str(part), f"{uri}/{part.name}")


def _created(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
