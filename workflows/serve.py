"""The OpenAI-compatible batch server as a Flyte app: one process holds the engine and the shared batchers.

    make serve                                         # 127.0.0.1:8000, the bundled SmolLM2 and MiniLM on CPU
    make serve ENGINE=vllm MODEL=Qwen/Qwen2.5-0.5B-Instruct PORT=9000
    flyte serve --local workflows/serve.py app_env     # the same app through flyte's CLI (BATCH_SERVE_* set it up)
    BATCH_SERVE_GPU=H100:1 flyte deploy workflows/serve.py app_env   # on Union, behind its authentication

Then point any OpenAI client at it: `OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")`.
The app (`workflows/server/`) serves chat, completions and embeddings online, the Batch API with its
jobs kept in SQLite under `BATCH_SERVE_DATA_DIR`, `/health` and Prometheus `/metrics`.

The environment's settings are read when this module is imported: `BATCH_SERVE_PORT` (8000) and
`BATCH_SERVE_HOST` (127.0.0.1; a deployment binds 0.0.0.0), `BATCH_SERVE_GPU` (`L4:1`; `none` for
CPU), `BATCH_SERVE_REPLICAS` (1: the Batch API's state lives in one replica's data folder), and
`BATCH_SERVE_IMAGE` for an image of your own. The server's own settings (engine, model, limits) are
read when it starts: see `workflows/server/settings.py`.
"""

from __future__ import annotations

import os

import flyte
import flyte.app
import uvicorn
from flyte.app.extras import FastAPIAppEnvironment

from images import serve_image
from workflows.server import ServerSettings, create_app

settings = ServerSettings.from_environment()
app = create_app()

_gpu = os.environ.get("BATCH_SERVE_GPU", "L4:1")
_replicas = int(os.environ.get("BATCH_SERVE_REPLICAS", "1"))

app_env = FastAPIAppEnvironment(
    name="batcher-openai",
    app=app,
    image=serve_image,
    resources=flyte.Resources(cpu=4, memory="32Gi", gpu=None if _gpu.lower() == "none" else _gpu),
    port=settings.port,
    uvicorn_config=uvicorn.Config(app, host=settings.host, port=settings.port),
    # Union's ingress admits only authenticated callers; BATCH_SERVE_API_KEY adds a key of our own.
    requires_auth=True,
    # Always one replica up (the engine takes minutes to load; scaling to zero would pay it per request).
    scaling=flyte.app.Scaling(replicas=(_replicas, _replicas)),
    env_vars={"BATCH_SERVE_HOST": "0.0.0.0"},  # inside the container: reachable by the ingress
)
