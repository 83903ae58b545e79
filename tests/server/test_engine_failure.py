"""The engine failing under a request: the client hears what happened and an error id, never the engine's own text.

The simulated engine's GPU thread is made to fail with a message that names a path, as a real
engine's may (a CUDA library, a model folder); the engine is dead, and every request it held fails
with `EngineDeadError`, whose text carries that message. A request not streamed gets a 503, a
stream that had begun ends with an `error` event; either says the model failed and gives an error
id, and the server's log has that id with the engine's message. The next request loads the model again.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flyteplugins_batcher.replica import EngineSettings
from flyteplugins_batcher.server import ServerSettings, create_app
from tests.server.conftest import openai

# The GPU thread dies of its error: that is the point, not a warning.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")

SECRET = "/opt/secret-models/cuda/libcuda.so.1: device lost"
"""What the failing engine says: a path no client should see."""

CHAT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": 64,
    "temperature": 0,
}
URL = "http://127.0.0.1:8000"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """An in-process server on the simulated engine (a step takes about 30 ms), no embeddings."""
    engine = EngineSettings(engine="simulated", engine_args=json.dumps({"time_scale": 0.25}))
    settings = ServerSettings(data_dir=tmp_path / "data", engine=engine, embeddings=False, port=8000)
    with TestClient(create_app(settings), base_url=URL, raise_server_exceptions=False) as http:
        yield http


def sdk(http: TestClient) -> openai.OpenAI:
    """The official client, strict, talking to the in-process server."""
    return openai.OpenAI(
        base_url=f"{URL}/v1", api_key="unused", max_retries=0, http_client=http, _strict_response_validation=True
    )


def fail_the_engine(http: TestClient, *, after_steps: int) -> None:
    """Make the loaded engine's GPU thread raise (with `SECRET`) once it has run `after_steps` steps."""
    gpu = http.app.state.service.inference.engine._gpu_thread
    steps, record_step = itertools.count(), gpu._on_step

    def on_step(result: Any) -> None:
        if next(steps) >= after_steps:
            raise RuntimeError(SECRET)
        record_step(result)

    gpu._on_step = on_step


def logged_incidents(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """The error ids the server logged, each with the text of its traceback's exceptions."""
    incidents = {}
    for record in caplog.records:
        message = record.getMessage()
        if "(error id " in message and record.exc_info:
            error = record.exc_info[1]
            chain = [error, error.__cause__, error.__context__]
            incidents[message.split("(error id ")[1].split(")")[0]] = " ".join(str(link) for link in chain if link)
    return incidents


def error_id(message: str) -> str:
    return message.split("error id ")[1].split(";")[0]


def test_a_request_whose_engine_dies_is_a_503_with_an_error_id_not_the_engines_text(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="flyteplugins_batcher.server")
    chat = sdk(client).chat.completions
    chat.create(model="simulated", **CHAT)
    fail_the_engine(client, after_steps=0)

    with pytest.raises(openai.InternalServerError) as failed:
        chat.create(model="simulated", **CHAT)

    error, body = failed.value, failed.value.response.text
    assert (error.status_code, error.code, error.type) == (503, "engine_unavailable", "server_error")
    assert "secret" not in body and "libcuda" not in body and "GPU thread" not in body
    assert "model failed" in error.message
    assert SECRET in logged_incidents(caplog)[error_id(error.message)]  # the log has the id, and the why
    assert chat.create(model="simulated", **CHAT).choices[0].message.content  # the model was loaded again


def test_a_stream_whose_engine_dies_ends_with_an_error_event_with_an_error_id(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="flyteplugins_batcher.server")
    chat = sdk(client).chat.completions
    chat.create(model="simulated", **CHAT)
    fail_the_engine(client, after_steps=5)

    chunks = []
    with pytest.raises(openai.APIError) as failed:  # the SDK raises the stream's `error` event
        chunks.extend(chat.create(model="simulated", stream=True, **CHAT))

    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks)  # it had begun
    error = failed.value
    assert error.code == "engine_unavailable" and "model failed" in error.message
    assert "secret" not in json.dumps(error.body) and "GPU thread" not in json.dumps(error.body)
    assert SECRET in logged_incidents(caplog)[error_id(error.message)]


@pytest.mark.slow
def test_an_embedding_model_failure_is_a_500_with_an_error_id_not_a_400_with_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("sentence_transformers", reason="needs the embed extra")
    from flyteplugins_batcher.replica import EmbeddingReplica

    caplog.set_level(logging.ERROR, logger="flyteplugins_batcher.server")
    engine = EngineSettings(engine="simulated", engine_args=json.dumps({"time_scale": 0.25}))
    settings = ServerSettings(data_dir=tmp_path / "data", engine=engine, embeddings=True, port=8000)
    with TestClient(create_app(settings), base_url=URL, raise_server_exceptions=False) as http:
        embeddings = sdk(http).embeddings
        embeddings.create(model="all-MiniLM-L6-v2", input=["fine"], encoding_format="float")

        def failing(texts: list[str]) -> list[Any]:
            # A ValueError, as torch raises for a batch it cannot stack: the model's failure, not the text's.
            raise ValueError(f"Unable to create tensor ({SECRET})")

        monkeypatch.setattr(EmbeddingReplica.of_process().model, "encode", failing)  # the server's, installed
        with pytest.raises(openai.InternalServerError) as failed:
            embeddings.create(model="all-MiniLM-L6-v2", input=["fine"], encoding_format="float")

    error = failed.value
    assert error.status_code == 500 and "secret" not in error.response.text and "tensor" not in error.response.text
    assert SECRET in logged_incidents(caplog)[error_id(error.message)]
