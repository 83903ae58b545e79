"""The OpenAI-compatible batch server as a Flyte app environment, configured from its settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

import flyte
import flyte.app
import rich.repr
from flyte.app.extras import FastAPIAppEnvironment

from flyteplugins_batcher.server._settings import ServerSettings

DEFAULT_APP_NAME = "batcher-openai"
DEFAULT_GPU = "L4:1"
DATABASE_URL_VARIABLE = "BATCH_SERVE_DATABASE_URL"
"""The variable a deployment's secret sets to share one database between replicas (`ServerSettings.database_url`)."""
DEPLOYED_HOST = "0.0.0.0"
"""Inside its container the server binds every address, so that the cluster's ingress reaches it."""


@rich.repr.auto
@dataclass(kw_only=True, repr=True)
class BatcherAppEnvironment(FastAPIAppEnvironment):
    """The OpenAI-compatible batch server as a Flyte app: online endpoints and the Batch API over one engine.

    One process holds the engine and the shared batchers; every request and batch line is a record
    in them. `settings` decides what it serves and its limits; `BATCH_SERVE_*` variables in the
    process that builds the environment override them (`flyteplugins-batcher serve` sets them from
    its flags). The port comes from `settings.port`, and a deployment binds 0.0.0.0 behind Union's
    authenticated ingress (`requires_auth=True`). `resources` are per replica; `None` gives 4 CPUs,
    32 GiB and one L4.

    With `settings.batch_executor="flyte"` the app is the Batch API's control plane: each batch is a
    run of the JSONL job, and the environment depends on the job's environments (its driver, the
    LLM and embedding replicas), so that `flyte deploy` deploys them with the app. More than one
    replica (`scaling`) needs a database they share: `settings.database_url`, or better a secret
    that sets `BATCH_SERVE_DATABASE_URL` at run time (`secrets=flyte.Secret(key=...,
    as_env_var="BATCH_SERVE_DATABASE_URL")`), so that its password is not in the code.

    Args:
        settings: The server's settings (engine, model, limits, data folder).
        app: The FastAPI app; `None` (the default) builds the server's app from `settings`.
        image: The container image; "auto" (the default) is `flyteplugins_batcher.images.SERVE_SPEC.resolve()`.

    Example:
        ```python
        from flyteplugins_batcher.replica import EngineSettings
        from flyteplugins_batcher.server import BatcherAppEnvironment, ServerSettings

        app_env = BatcherAppEnvironment(
            name="qwen-batch",
            settings=ServerSettings(engine=EngineSettings(engine="vllm", model="Qwen/Qwen2.5-7B-Instruct")),
            resources=flyte.Resources(cpu=8, memory="64Gi", gpu="H100:1"),
        )
        ```

    Raises:
        ValueError: Several replicas without a shared database.
    """

    name: str = DEFAULT_APP_NAME
    settings: ServerSettings = field(default_factory=ServerSettings)
    app: Any = None
    type: str = "flyteplugins-batcher"
    image: str | flyte.Image | Literal["auto"] = "auto"
    # Always one replica up: the engine takes minutes to load. More share their batches through settings.database_url.
    scaling: flyte.app.Scaling = field(default_factory=lambda: flyte.app.Scaling(replicas=(1, 1)))

    def __post_init__(self) -> None:
        import uvicorn

        from flyteplugins_batcher.server._http.app import create_app
        from flyteplugins_batcher.server._http.limits import http_protocol
        from flyteplugins_batcher.server._settings import MAX_HEAD_BYTES

        self.settings = ServerSettings.from_environment(base=self.settings)
        if self.app is None:
            self.app = create_app(self.settings)
        if self.image is None or self.image == "auto":
            from flyteplugins_batcher.images import SERVE_SPEC

            self.image = SERVE_SPEC.resolve()
        if self.resources is None:
            self.resources = flyte.Resources(cpu=4, memory="32Gi", gpu=DEFAULT_GPU)
        self.env_vars = {"BATCH_SERVE_HOST": DEPLOYED_HOST, **(self.env_vars or {})}
        self._check_replicas()
        if self.settings.batch_executor == "flyte":
            from flyteplugins_batcher.jobs import jsonl_driver_env

            self.add_dependency(jsonl_driver_env)  # deployed with the app: its batches are runs of the job
        self.port = self.settings.port
        self.uvicorn_config = uvicorn.Config(
            self.app,
            host=self.settings.host,
            port=self.settings.port,
            http=http_protocol(),  # a request's line and headers bounded, as its body is (`_limits`)
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        )
        super().__post_init__()

    def _check_replicas(self) -> None:
        replicas = self.scaling.replicas
        most = replicas[1] if isinstance(replicas, tuple) else replicas
        if most > 1 and not self.settings.database_url and not self._database_url_secret():
            raise ValueError(
                f"{self.name}: {most} replicas need a database they share (settings.database_url, or a secret "
                f"as_env_var={DATABASE_URL_VARIABLE!r}): each would otherwise see only its own batches"
            )

    def _database_url_secret(self) -> bool:
        """Whether a secret gives the replicas their database URL at run time (a password stays out of the code)."""
        secrets = self.secrets if isinstance(self.secrets, list | tuple) else [self.secrets]
        return any(getattr(secret, "as_env_var", None) == DATABASE_URL_VARIABLE for secret in secrets)


def default_app_environment() -> BatcherAppEnvironment:
    """The server as `flyteplugins-batcher serve` and `workflows/serve.py` run it, sized from `BATCH_SERVE_*`.

    `BATCH_SERVE_GPU` (`L4:1`; `none` for CPU) and `BATCH_SERVE_REPLICAS` (1) size the deployment;
    every server setting is a `BATCH_SERVE_*` variable too (`ServerSettings`).
    """
    gpu = os.environ.get("BATCH_SERVE_GPU", DEFAULT_GPU)
    replicas = int(os.environ.get("BATCH_SERVE_REPLICAS", "1"))
    return BatcherAppEnvironment(
        resources=flyte.Resources(cpu=4, memory="32Gi", gpu=None if gpu.lower() == "none" else gpu),
        scaling=flyte.app.Scaling(replicas=(replicas, replicas)),
    )
