"""Running a job from the command line: flyte's local runner in this process, its failure as a clean exit."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import rich_click as click


def run_locally(task: Any, **inputs: Any) -> Any:
    """Run a job's driver task with flyte's local runner and return its output.

    Its chunks run in this process, on this process's replica (one engine, one shared batcher),
    and Flyte's local cache keeps finished chunks, so running the same job again resumes it.

    Raises:
        click.ClickException: The job failed; its message says why (exit code 1).
    """
    import flyte
    import flyte.errors

    init_local()
    try:
        run = flyte.with_runcontext(mode="local").run(task, **inputs)
        return run.outputs()[0]
    except flyte.errors.BaseRuntimeError as error:
        raise click.ClickException(_reason(error)) from None


def init_local() -> None:
    """Initialize flyte for local runs in this process (no cluster, no config file needed)."""
    import flyte

    logging.getLogger("flyte").setLevel(logging.WARNING)
    flyte.init()


def local_file(path: Path) -> Any:
    """A `flyte.io.File` of a local file, as a job's input."""
    from flyte.io import File

    init_local()
    return File.from_local_sync(str(path.resolve()))


def _reason(error: BaseException) -> str:
    """The job's own message, without flyte's wrapping of it."""
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__
