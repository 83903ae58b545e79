"""A request line becomes a chunk item, the item a generation config, in one place each; items cross Flyte intact."""

from __future__ import annotations

import json

import flyte
import pytest

from flyteplugins_batcher.batch_api import parse_request_line
from flyteplugins_batcher.engines import GenerationConfig
from workflows.jsonl_job import to_item
from workflows.schema import ChatMessage, EngineSettings, RequestChunk, RequestItem

DEFAULTS = EngineSettings(max_new_tokens=64, temperature=0.2, top_p=0.8, seed=5).generation()
LINES = [
    {"custom_id": "plain", "prompt": "Hello"},
    {"custom_id": "own", "prompt": "Hi", "max_tokens": 7, "temperature": 1, "top_p": 0.5, "stop": "\n", "seed": 3},
    {"custom_id": "chat", "messages": [{"role": "user", "content": "Hey"}], "max_completion_tokens": 9},
]

env = flyte.TaskEnvironment(name="jsonl_job_test")


@env.task
async def through_flyte(chunk: RequestChunk) -> RequestChunk:
    return chunk


@pytest.mark.parametrize("line", LINES, ids=[line["custom_id"] for line in LINES])
def test_an_item_runs_with_exactly_the_settings_its_line_asked_for(line: dict):
    request = parse_request_line(json.dumps(line), 1)
    item = to_item(request)

    engine_request = item.engine_request(DEFAULTS)

    assert engine_request.generation == request.generation(DEFAULTS)
    assert engine_request.id == line["custom_id"]
    assert engine_request.prompt == request.prompt


def test_an_item_without_settings_of_its_own_runs_with_the_run_defaults():
    item = RequestItem("k", prompt="x")
    assert (item.max_new_tokens, item.temperature, item.top_p, item.stop, item.seed) == (None,) * 5
    assert item.generation(DEFAULTS) is DEFAULTS
    assert RequestItem("k", temperature=0.0).generation(DEFAULTS) == GenerationConfig(64, 0.0, 0.8, (), 5)


def test_an_out_of_range_setting_fails_when_the_item_becomes_a_config():
    with pytest.raises(ValueError, match="top_p must be in"):
        RequestItem("k", top_p=2.0).generation(DEFAULTS)


def test_items_with_and_without_their_own_settings_cross_flyte_unchanged(run_locally):
    items = [to_item(parse_request_line(json.dumps(line), number)) for number, line in enumerate(LINES, start=1)]
    items.append(RequestItem("empty-stop", messages=[ChatMessage("user", "x")], stop=[]))
    chunk = RequestChunk(3, items)

    assert run_locally(through_flyte, chunk=chunk) == chunk
