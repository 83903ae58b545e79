"""`flyteplugins-batcher serve`: the OpenAI-compatible server in the foreground, through flyte's local serving.

    flyteplugins-batcher serve [--port 8000] [--data-dir .serve-data] [--engine vllm] [--model ID] ...

Every setting of the server (`ServerSettings`) and of its engine (`EngineSettings`, as the jobs
take them) is a flag: `--max-new-tokens 512`, `--vllm-mode batch`, `--max-queue-size 64`,
`--no-embeddings`, ... It sets the matching `BATCH_SERVE_*` variables, builds the Flyte app
(`default_app_environment()`) and serves it on 127.0.0.1 until Ctrl+C or SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import rich_click as click

from flyteplugins_batcher.cli._options import (
    VLLMStyleCommand,
    accepted_vllm_flags,
    given_on_command_line,
    setting_options,
)
from flyteplugins_batcher.replica import EngineSettings
from flyteplugins_batcher.server import ServerSettings

ACTIVATE_TIMEOUT_S = 900.0
"""How long the server may take to load its models before the command gives up (vLLM's start-up on CPU)."""


@click.command("serve", cls=VLLMStyleCommand, context_settings={"help_option_names": ["-h", "--help"]})
@accepted_vllm_flags
@setting_options(ServerSettings, EngineSettings)
@click.pass_context
def serve(ctx: click.Context, enable_auto_tool_choice: bool, **options: Any) -> None:
    """Serve the OpenAI-compatible API (online requests and the Batch API) on this machine, until Ctrl+C.

    Every setting of the server and of its engine is an option; one left out keeps its
    BATCH_SERVE_* variable, else its default. It serves the Flyte app (`BatcherAppEnvironment`)
    through flyte's local serving, on 127.0.0.1:8000 unless told otherwise.
    """
    for name, value in given_on_command_line(ctx, options).items():
        os.environ[ServerSettings.variable(name)] = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        ServerSettings.from_environment()  # a bad value fails here, naming its variable
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import flyte

    from flyteplugins_batcher.server import default_app_environment

    served = flyte.with_servecontext(mode="local").serve(default_app_environment())
    served.activate(wait=False)
    if not _ready(served):
        raise click.ClickException("the server did not start (its log above says why)")
    click.echo(f"serving on {served.endpoint}/v1 (OpenAI-compatible); Ctrl+C stops")
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
