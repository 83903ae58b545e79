"""An OpenAI-compatible server around the replica's engine and shared batchers, as a Flyte app.

Many clients send requests at once; one process batches them into the model. It serves the online
endpoints (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`), the Batch
API (`/v1/files`, `/v1/batches`) with its jobs kept in SQLite so that they survive a `kill -9`,
`/health` and Prometheus `/metrics`. `BatcherAppEnvironment` is the Flyte app; `create_app`
builds the FastAPI app it serves; `flyteplugins-batcher serve` runs it.

The way of a request, one module per step:

- `_settings`: what the server is told (`ServerSettings`, `BATCH_SERVE_*`, or `serve`'s flags).
- `_guards`, `_limits`, `_head_limit`: what a request must be before it is read (`_app.ServerLayers`
  runs them): a `Host` the server answers, no foreign `Origin`, the API key, the body's type, and
  its size counted as it arrives (its line and headers in uvicorn's protocol).
- `_online`: an HTTP request is parsed as a batch line would be (`flyteplugins_batcher.batch_api`)
  and becomes one record in the replica's shared batcher (`_inference`), ahead of batch lines;
  `_streaming` sends a streamed answer's events as the engine makes its text, and `_live` cancels
  the record of a client who leaves (streamed or not).
- `_files`, `_batch_jobs`, `_batch_runner`: an uploaded file, a batch over it, and the runner that
  sends its lines through the JSONL job's code (`flyteplugins_batcher/replica/_lines.py`),
  recording each answered line in `_store` before it counts.
- `_errors`: every failure in OpenAI's error shape; `_metrics`: what `/metrics` exports.

Example:
    ```python
    from flyteplugins_batcher.replica import EngineSettings
    from flyteplugins_batcher.server import BatcherAppEnvironment, ServerSettings

    app_env = BatcherAppEnvironment(settings=ServerSettings(engine=EngineSettings(model="Qwen/Qwen2.5-7B-Instruct")))
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.server._app_env import BatcherAppEnvironment, default_app_environment
from flyteplugins_batcher.server._http.app import create_app
from flyteplugins_batcher.server._settings import ServerSettings

__all__ = ["BatcherAppEnvironment", "ServerSettings", "create_app", "default_app_environment"]
