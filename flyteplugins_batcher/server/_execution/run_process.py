"""A local run of the JSONL job in a process of its own.

`python -m flyteplugins_batcher.server._execution.run_process INPUTS`.

The flyte executor starts it when a server's local runs are separate processes
(`ServerSettings.local_runs="process"`): the run has its own replica, its own engine and batcher,
as a run on a cluster has GPU replicas of its own, and the server's engine answers online requests
alone. INPUTS is the job's inputs as JSON, with `input` a local path; the run goes through flyte's
local runner, as the server's own local runs do (`LocalRuns`), and its exit status says how it ended
(0: succeeded). It dies with the server that started it (Linux: the parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies (Linux; elsewhere nothing happens).

    Called in the child between fork and exec (`subprocess.Popen(preexec_fn=...)`): a server killed
    with `kill -9` leaves no run behind to answer its lines twice.
    """
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the run may outlive a killed server
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def run(inputs: dict[str, Any]) -> None:
    """Run the JSONL job with `inputs` (`input`: a local path) on flyte's local runner in this process."""
    import flyte
    from flyte.io import File

    from flyteplugins_batcher.jobs import run_batch_file

    logging.getLogger("flyte").setLevel(logging.WARNING)
    flyte.init()  # local: no cluster, no config file
    local_input = File(path=str(Path(inputs["input"]).resolve()))
    flyte.with_runcontext(mode="local").run(run_batch_file, **{**inputs, "input": local_input})


if __name__ == "__main__":
    try:
        run(json.loads(sys.argv[1]))
    except (
        Exception
    ) as error:  # the job's own message (flyte's last line), for the run's log; the exit status says it failed
        reason = str(error).strip().splitlines()[-1:] or [type(error).__name__]
        print(f"run failed: {reason[0]}", file=sys.stderr)
        sys.exit(1)
