"""The server's settings, read from the environment (`BATCH_SERVE_*`) when the app starts.

One source for every way the server starts: `make serve` and `flyteplugins-batcher serve` turn
their flags into these variables, `flyte serve --local workflows/serve.py app_env` reads them as
they are (`-e BATCH_SERVE_ENGINE=vllm`), and a deployment sets them on the app. Every field of
`EngineSettings` is a variable too: `BATCH_SERVE_ENGINE`, `BATCH_SERVE_MODEL`,
`BATCH_SERVE_VLLM_MODE`, `BATCH_SERVE_MAX_NEW_TOKENS`, `BATCH_SERVE_MAX_QUEUE_SIZE`, ...
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flyteplugins_batcher.jobs import DeclaredOption
from flyteplugins_batcher.replica import ChunkCutter, EngineSettings

PREFIX = "BATCH_SERVE_"


MAX_HEAD_BYTES = 64 * 1024
"""Most bytes of a request's line and headers (`_http/head_limit.py` holds them to it): four times h11's
default, space for long tokens."""


@dataclass(frozen=True)
class ServerSettings:
    """What the server serves, where it keeps its state, and its limits.

    Attributes:
        host: The address to bind: 127.0.0.1 (this machine only) unless told otherwise; a
            deployment binds 0.0.0.0 behind its ingress.
        port: The port to listen on.
        data_dir: Where the jobs' database (`server.db`) and the files (`files/`) live.
        engine: The LLM engine and its generation and batcher settings, as the workflows take them.
        embeddings: Serve `/v1/embeddings` with the embedding model (`EMBED_MODEL`, by default
            all-MiniLM-L6-v2), loaded at start.
        max_upload_mb: Largest file `/v1/files` takes (413 above it); OpenAI's limit for batch files.
            Counted on the bytes as they arrive, chunked or not: an upload stops being read at the limit.
        max_request_mb: Largest body of every other request (413 above it, counted as it arrives). 16 MiB
            holds the largest legitimate request: a chat request that fills a 1M-token context is
            about 4 MB of English text (4 bytes a token), with space for JSON's escapes and framing,
            and a 128k-token one fits even with every character escaped (6 bytes each). What is
            larger is refused as it arrives, so no client makes the server hold more.
        batch_chunk_size: Requests per chunk of a batch job (a chunk is what is recorded at once).
        batch_chunks_in_flight: Chunks of one batch job outstanding at once (0: enough to fill the engine).
        batch_order: How a batch job's requests are cut into chunks: "prefix" puts those that share a prompt
            prefix in the same chunks, so that the engine's prefix cache computes it once; "file" keeps the
            input file's order (`RunOptions.order`).
        api_key: When set, every `/v1` request must send `Authorization: Bearer <api_key>`.
        allowed_hosts: More `Host` headers to answer, comma-separated (`gpu-box.lan,10.0.0.5:8000`; `*`
            for any). The server answers only the address it binds (and 127.0.0.1, localhost and [::1]),
            so that a web page cannot reach it by DNS rebinding; a 0.0.0.0 bind answers any host.
        cors_origins: Web origins allowed to call the API from a browser, comma-separated
            (`https://app.example.com`); none by default, and a request from another origin is refused.
        short_windows: Also take completion windows in minutes and seconds (`90m`, `5s`), for tests and
            demos of a batch that expires. Off, a window is OpenAI's form, `<n>h`, from 1h to 168h.
        database_url: The jobs' database. Empty (the default): SQLite in `data_dir` (`server.db`), for
            this server alone. `postgresql://user:password@host:5432/db` (psycopg; `postgresql+psycopg://`
            too): PostgreSQL, which several replicas share, each running the batches it holds a lease
            on and taking over those of a replica that stops renewing; give them one shared `data_dir`
            or one `files_uri` too, for the files. Its password never appears in logs or responses.
        lease_s: How long a server's claim on a batch lasts without renewal (it renews every third of
            it): a replica that dies has its batches taken over by another this long after.
        batch_executor: What runs a batch's lines. `in-process` (the default): this server's own
            engine, a chunk at a time. `flyte`: each batch is a Flyte run of the JSONL job
            (`run_batch_file`, as `run-batch` runs it), whose chunks fan out to the reusable LLM and
            embedding replicas; the batch follows the run (status, counts, cancel, expiry), and its
            object names the run (`flyte_run`).
        runs_uri: Where the `flyte` executor's runs keep their input, journal and outputs, a place the
            server and the runs both reach. Empty (the default): `data_dir/runs`, with runs on flyte's
            local runner in this process. An object-store prefix (`s3://bucket/batcher`, `gs://...`):
            runs on the cluster the app is deployed to, of the job task deployed with it.
        local_runs: Where the `flyte` executor's local runs (no remote `runs_uri`) run their chunks.
            `server` (the default): on the server's own engine, in its process (one model in memory;
            online requests go first in its batcher, but share the engine's steps with the batch).
            `process`: each run is a process of its own with its own engine, as a run on a cluster
            has its GPU replicas, so that the server's engine answers online requests alone (a second
            model in memory).
        files_uri: Where the files (uploads, batches' output and error files) are kept for every replica.
            Empty (the default): only in `data_dir/files`, which replicas share by sharing `data_dir`.
            An object-store prefix (`s3://bucket/batcher/files`, `gs://...`; `file:///abs/path` for a
            shared mount): every file is also put there before its row is committed, and that copy is
            the one of record: a replica with a `data_dir` of its own fetches there the files another
            made. One prefix per jobs database.
        online_ttft_slo_s: The time to first token that `online_slo_quantile` of online requests must
            meet, in seconds, from their arrival to the first text the engine makes (0: none). Batch
            lines have no target: with one, they get only the quota of the engine the online target
            leaves them (`server/_admission.py`), given back as online traffic falls; when online
            requests alone are more than it allows, new ones are answered 429 with a `Retry-After`.
            An engine that answers whole records (Transformers, vLLM batch mode) makes its first text
            with its answer.
        online_tpot_slo_s: The time per output token (after the first) that `online_slo_quantile` of
            online requests must meet, in seconds (0: none); on an engine that schedules sequences
            itself it is the engine's step time, which grows with every sequence in the step.
        online_slo_quantile: The share of online requests that must meet `online_ttft_slo_s` and
            `online_tpot_slo_s` (0.99: the p99).
        stream_keepalive_s: Seconds between the comments (`: keep-alive`) a streamed answer sends while
            it waits for text, so that a client's or a proxy's read timeout does not end it (0: none).
            A stream's headers go out as soon as its request is admitted, whatever the engine.

    Example:
        ```python
        settings = ServerSettings.from_environment({"BATCH_SERVE_PORT": "9000", "BATCH_SERVE_ENGINE": "simulated"})
        ```
    """

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path(".serve-data")
    engine: EngineSettings = field(default_factory=EngineSettings)
    embeddings: bool = True
    max_upload_mb: int = 200
    max_request_mb: int = 16
    batch_chunk_size: int = 8
    batch_chunks_in_flight: int = 0
    batch_order: str = "prefix"
    api_key: str = ""
    allowed_hosts: str = ""
    cors_origins: str = ""
    short_windows: bool = False
    database_url: str = field(default="", repr=False)  # a URL may hold a password: not in the settings' repr
    lease_s: float = 15.0
    batch_executor: str = "in-process"
    runs_uri: str = ""
    local_runs: str = "server"
    files_uri: str = ""
    online_ttft_slo_s: float = 0.0
    online_tpot_slo_s: float = 0.0
    online_slo_quantile: float = 0.99
    stream_keepalive_s: float = 15.0

    def __post_init__(self) -> None:
        if self.batch_order not in ChunkCutter.ORDERS:
            raise ValueError(f"batch_order must be one of {', '.join(ChunkCutter.ORDERS)}, got {self.batch_order!r}")
        declared = self.engine.base_models()
        if len(declared) > 1:
            raise ValueError(
                f"the server serves one base model, and model names {len(declared)} ({', '.join(declared)}): "
                "swapping models would stall every online request for a load. Run a file that mixes base "
                "models with `flyteplugins-batcher run-batch --model A --model B`, which time-shares its replicas"
            )

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 2**20

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mb * 2**20

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, *, base: ServerSettings | None = None
    ) -> ServerSettings:
        """The settings in `BATCH_SERVE_*` variables (of `environ`, by default this process's) over `base`.

        Args:
            environ: The variables; `None`: this process's environment.
            base: The settings a variable overrides; `None`: the defaults.

        Raises:
            ValueError: A variable holds a value of the wrong type, naming it.
        """
        environ = os.environ if environ is None else environ
        base = base or cls()
        engine = dataclasses.replace(base.engine, **_read_fields(EngineSettings, environ, skip=()))
        return dataclasses.replace(base, engine=engine, **_read_fields(cls, environ, skip=("engine",)))

    @staticmethod
    def variable(name: str) -> str:
        """The environment variable of a setting (`max_queue_size`: `BATCH_SERVE_MAX_QUEUE_SIZE`)."""
        return f"{PREFIX}{name.upper()}"

    def environment(self) -> dict[str, str]:
        """These settings as `BATCH_SERVE_*` variables (what `from_environment` reads back)."""
        server = {item.name: getattr(self, item.name) for item in dataclasses.fields(self) if item.name != "engine"}
        values = {**server, **dataclasses.asdict(self.engine)}  # the engine's `engine` field is BATCH_SERVE_ENGINE
        return {f"{PREFIX}{name.upper()}": _text(value) for name, value in values.items() if value is not None}


def _read_fields(cls: type, environ: Mapping[str, str], *, skip: tuple[str, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for option in DeclaredOption.fields_of(cls):
        variable = ServerSettings.variable(option.name)
        if option.name not in skip and variable in environ:
            values[option.name] = _parse(environ[variable], option, variable)
    return values


def _parse(text: str, option: DeclaredOption, variable: str) -> Any:
    """A variable's text as the field's type (`int | None`: empty is `None`)."""
    if option.optional and not text.strip():
        return None
    kind = option.kind
    try:
        if kind is bool:
            return _boolean(text)
        if kind in (int, float, str, Path):
            return kind(text)
    except ValueError as error:
        raise ValueError(f"{variable}={text!r}: {error}") from None
    raise TypeError(f"{variable}: fields of type {kind} cannot be read from the environment")


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
