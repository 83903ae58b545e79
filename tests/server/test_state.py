"""The server's state without a server: settings from the environment, batch transitions, the store, stream events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flyteplugins_batcher.replica import EngineSettings, FinishedLine
from flyteplugins_batcher.server import ServerSettings
from flyteplugins_batcher.server._execution.runner import BatchRunner
from flyteplugins_batcher.server._http.errors import APIError
from flyteplugins_batcher.server._http.streaming import stream_events
from flyteplugins_batcher.server._state.batches import (
    batch_creation,
    checked_metadata,
    moved,
    new_batch,
    window_seconds,
)
from flyteplugins_batcher.server._state.errors import StateError
from flyteplugins_batcher.server._state.files import FileStore
from flyteplugins_batcher.server._state.statuses import BATCH_TRANSITIONS
from flyteplugins_batcher.server._state.store import Store

INPUT = {"id": "file-1", "purpose": "batch"}


def batch_of(endpoint: str = "/v1/completions", window: str = "24h", **fields: object) -> dict:
    """A new batch for a body with these fields, over `INPUT`."""
    body = {"input_file_id": "file-1", "endpoint": endpoint, "completion_window": window, **fields}
    return new_batch(batch_creation(body), input_file=INPUT, model="m")


def test_settings_come_from_batch_serve_variables_engine_fields_included() -> None:
    settings = ServerSettings.from_environment(
        {
            "BATCH_SERVE_PORT": "9001",
            "BATCH_SERVE_EMBEDDINGS": "false",
            "BATCH_SERVE_ENGINE": "vllm",
            "BATCH_SERVE_MAX_NEW_TOKENS": "512",
            "BATCH_SERVE_SEED": "",
            "BATCH_SERVE_DATA_DIR": "/tmp/x",
        }
    )

    assert (settings.port, settings.embeddings, settings.data_dir) == (9001, False, Path("/tmp/x"))
    assert settings.engine == EngineSettings(engine="vllm", max_new_tokens=512, seed=None)
    assert ServerSettings.from_environment(settings.environment()) == settings  # what the CLI sets is read back
    with pytest.raises(ValueError, match="BATCH_SERVE_PORT='eighty'"):
        ServerSettings.from_environment({"BATCH_SERVE_PORT": "eighty"})


def test_a_batch_moves_only_along_its_transitions_stamping_each_status() -> None:
    batch = batch_of(metadata={"k": "v"})

    running = moved(batch, "in_progress")
    cancelling = moved(running, "cancelling")

    assert batch["status"] == "validating" and 24 * 3600 <= batch["expires_at"] - batch["created_at"] <= 24 * 3600 + 1
    assert running["in_progress_at"] and cancelling["cancelling_at"] and moved(cancelling, "cancelled")["cancelled_at"]
    with pytest.raises(ValueError, match="cannot go from cancelling to completed"):
        moved(cancelling, "completed")
    assert all(final not in BATCH_TRANSITIONS for final in ("completed", "failed", "expired", "cancelled"))


GOOD = {"input_file_id": "file-1", "endpoint": "/v1/completions", "completion_window": "24h"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"endpoint": "/v1/completions", "completion_window": "24h"}, "input_file_id"),
        ({**GOOD, "input_file_id": 7}, "input_file_id"),
        ({**GOOD, "endpoint": "/v1/moderations"}, "endpoint"),
        ({"input_file_id": "file-1", "completion_window": "24h"}, "endpoint"),
        ({**GOOD, "completion_window": "1 day"}, "completion_window"),
        ({"input_file_id": "file-1", "endpoint": "/v1/completions"}, "completion_window"),
        ({**GOOD, "metadata": {"k": 7}}, "metadata"),
        ({**GOOD, "metadata": {f"k{n}": "v" for n in range(17)}}, "metadata"),
        ({**GOOD, "priority": "high"}, "priority"),
    ],
)
def test_a_bad_batch_request_is_a_400_naming_its_field(body: dict, param: str) -> None:
    with pytest.raises(StateError) as refused:
        batch_creation(body)
    assert APIError.from_state(refused.value).status == 400 and refused.value.param == param


@pytest.mark.parametrize(
    "window",
    ["24h\n", "\u0662\u0664h", "99999999999999999999h", "0h", "169h", "9" * 5000 + "h", "90m", "5s", " 1h", 24],
)
def test_a_completion_window_is_openais_form_only_within_a_week(window: object) -> None:
    with pytest.raises(StateError) as refused:
        window_seconds(window)
    assert APIError.from_state(refused.value).status == 400 and refused.value.param == "completion_window"
    assert len(refused.value.message) < 200  # a 5,000-digit window is not echoed whole


def test_completion_windows_and_metadata_as_the_api_allows_them() -> None:
    assert [window_seconds(w) for w in ("24h", "1h", "168h")] == [86_400, 3_600, 604_800]
    assert [window_seconds(w, short_windows=True) for w in ("24h", "90m", "5s")] == [86_400, 5_400, 5]
    with pytest.raises(StateError, match="from 1s to 168h"):
        window_seconds("0s", short_windows=True)
    assert checked_metadata(None) is None and checked_metadata({"a": "b"}) == {"a": "b"}


async def test_a_batch_whose_every_line_was_answered_is_completed_even_once_its_window_has_closed(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "server.db")
    files = FileStore(tmp_path / "files", store, max_bytes=2**20)
    files.path("file-1").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    late = moved(batch_of(window="1h"), "in_progress") | {"expires_at": 1, "request_counts": {"total": 2}}
    early = moved(batch_of(window="1h"), "in_progress") | {"expires_at": 1, "request_counts": {"total": 2}}
    for batch in (late, early):
        store.insert_batch(batch | {"request_counts": {"total": 2, "completed": 0, "failed": 0}})
    store.record_lines(late["id"], [FinishedLine(1, True, {"n": 1}), FinishedLine(2, True, {"n": 2})])  # both answered
    store.record_lines(early["id"], [FinishedLine(1, True, {"n": 1})])  # one left when the window closed
    runner = BatchRunner(store, files, inference=None, settings=ServerSettings())  # type: ignore[arg-type]

    for batch in (late, early):
        await runner._finish(store.batch(batch["id"]))

    assert store.batch(late["id"])["status"] == "completed"
    ended = store.batch(early["id"])
    assert ended["status"] == "expired" and ended["request_counts"] == {"total": 2, "completed": 1, "failed": 1}


def test_a_line_recorded_twice_is_kept_and_counted_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "server.db")
    store.insert_batch(batch_of() | {"id": "b1"})
    first = [FinishedLine(1, True, {"n": 1}, 5, 7, cached_tokens=4), FinishedLine(2, False, {"n": 2})]

    store.record_lines("b1", first)
    batch = store.record_lines("b1", [*first, FinishedLine(3, True, {"n": 3}, 1, 1)])  # a chunk run again, and one more

    assert batch is not None and batch["request_counts"] == {"total": 0, "completed": 2, "failed": 1}
    assert batch["usage"] == {
        "input_tokens": 6,
        "input_tokens_details": {"cached_tokens": 4},  # the engine's prefix-cache hits, summed as the lines come
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 14,
    }
    assert [json.loads(line)["n"] for line in store.outputs("b1", ok=True)] == [1, 3]
    assert store.answered_lines("b1") == {1, 2, 3}
    reopened = Store(tmp_path / "server.db")  # what a restarted server reads
    assert reopened.batch("b1") == batch


def test_a_streamed_whole_chat_answer_is_role_then_content_then_finish_then_usage_then_done() -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "finish_reason": "stop", "logprobs": None, "message": {"role": "assistant", "content": "4"}}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }

    events = list(stream_events(body, include_usage=True))

    data = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert [event["choices"] for event in data] == [
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {"content": "4"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
        [],
    ]
    assert data[-1]["usage"] == body["usage"] and events[-1] == "data: [DONE]\n\n"
    assert {event["object"] for event in data} == {"chat.completion.chunk"}
