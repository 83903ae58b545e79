"""`make serve`: the OpenAI-compatible server in the foreground, through flyte's local serving.

    python -m flyteplugins_batcher.cli._serve [--port 8000] [--data-dir .serve-data] [--engine vllm] [--model ID] ...

Every setting of the server (`ServerSettings`) and of its engine (`EngineSettings`, as the
workflows take them) is a flag: `--max-new-tokens 512`, `--vllm-mode batch`, `--max-queue-size 64`,
`--no-embeddings`, ... It sets the matching `BATCH_SERVE_*` variables, imports the Flyte app
(`workflows/serve.py`) and serves it on 127.0.0.1 until Ctrl+C or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import typing
from typing import Any

from flyteplugins_batcher.jobs._schema import EngineSettings
from flyteplugins_batcher.server._settings import PREFIX, ServerSettings

ACTIVATE_TIMEOUT_S = 900.0
"""How long the server may take to load its models before the command gives up (vLLM's start-up on CPU)."""


def parser() -> argparse.ArgumentParser:
    """One flag per setting, from the dataclasses' fields (defaults shown as the server's)."""
    arguments = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    for cls in (ServerSettings, EngineSettings):
        hints = typing.get_type_hints(cls)
        for item in dataclasses.fields(cls):
            if item.name == "engine" and cls is ServerSettings:
                continue
            flag = f"--{item.name.replace('_', '-')}"
            if hints[item.name] is bool:
                arguments.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
            else:
                arguments.add_argument(flag, default=None, metavar=item.name.upper())
    return arguments


def main(argv: list[str] | None = None) -> None:
    given = {name: value for name, value in vars(parser().parse_args(argv)).items() if value is not None}
    for name, value in given.items():
        os.environ[f"{PREFIX}{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    ServerSettings.from_environment()  # a bad value fails here, naming its flag's variable
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import flyte

    from flyteplugins_batcher.server import default_app_environment

    served = flyte.with_servecontext(mode="local").serve(default_app_environment())
    served.activate(wait=False)
    if not _ready(served):
        raise SystemExit("the server did not start (its log above says why)")
    print(f"serving on {served.endpoint}/v1 (OpenAI-compatible); Ctrl+C stops", flush=True)
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()
    served.deactivate(wait=True)


def _ready(served: Any) -> bool:
    """Wait until the server answers `/health` (its models loaded), or its thread ended (it failed to start)."""
    deadline = time.monotonic() + ACTIVATE_TIMEOUT_S
    while time.monotonic() < deadline:
        if served.is_active():
            return True
        if served.is_deactivated():
            return False
        time.sleep(0.5)
    return False


if __name__ == "__main__":
    sys.exit(main())
