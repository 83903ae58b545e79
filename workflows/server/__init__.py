"""An OpenAI-compatible server around the replica's engine and shared batchers, as a Flyte app.

Many clients send requests at once; one process batches them into the model. It serves the online
endpoints (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`), the Batch
API (`/v1/files`, `/v1/batches`) with its jobs kept in SQLite so that they survive a `kill -9`,
`/health` and Prometheus `/metrics`. `workflows/serve.py` declares the Flyte app; `create_app`
builds the FastAPI app it serves.

The way of a request, one module per step:

- `settings`: what the server is told (`BATCH_SERVE_*`, or `make serve`'s flags).
- `online`: an HTTP request is parsed as a batch line would be (`flyteplugins_batcher.batch_api`)
  and becomes one record in the replica's shared batcher (`inference`), ahead of batch lines.
- `files`, `batch_jobs`, `batch_runner`: an uploaded file, a batch over it, and the runner that
  sends its lines through the same code as `workflows/batch_jsonl.py` (`workflows/request_lines.py`),
  recording each answered line in `store` before it counts.
- `errors`: every failure in OpenAI's error shape; `metrics`: what `/metrics` exports.
"""

from __future__ import annotations

from workflows.server.app import create_app
from workflows.server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
