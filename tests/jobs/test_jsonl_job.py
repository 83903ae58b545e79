"""A request line becomes a chunk item, the item a generation config, in one place each; items cross Flyte intact."""

from __future__ import annotations

import json

import flyte
import pytest

from flyteplugins_batcher.batch_api import ENDPOINTS, parse_request_line
from flyteplugins_batcher.engines import Completion, GenerationConfig, ResponseFormat, Sample
from flyteplugins_batcher.replica import ChatMessage, ChunkCutter, EngineSettings, ItemResult, RequestChunk, RequestItem

DEFAULTS = EngineSettings(max_new_tokens=64, temperature=0.2, top_p=0.8, seed=5).generation()
SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["a"]}
LINES = [
    {"custom_id": "plain", "prompt": "Hello"},
    {"custom_id": "own", "prompt": "Hi", "max_tokens": 7, "temperature": 1, "top_p": 0.5, "stop": "\n", "seed": 3},
    {"custom_id": "chat", "messages": [{"role": "user", "content": "Hey"}], "max_completion_tokens": 9},
    {"custom_id": "samples", "prompt": "Hi", "n": 3, "temperature": 0.7},
    {"custom_id": "object", "prompt": "Hi", "response_format": {"type": "json_object"}},
    {
        "custom_id": "schema",
        "prompt": "Hi",
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    },
    {"custom_id": "text", "prompt": "Hi", "response_format": {"type": "text"}},
    {"custom_id": "completion", "url": "/v1/completions", "body": {"prompt": "Once upon", "max_tokens": 5}},
]

env = flyte.TaskEnvironment(name="jsonl_job_test")


@env.task
async def through_flyte(chunk: RequestChunk) -> RequestChunk:
    return chunk


@pytest.mark.parametrize("line", LINES, ids=[line["custom_id"] for line in LINES])
def test_an_item_runs_with_exactly_the_settings_its_line_asked_for(line: dict):
    request = parse_request_line(json.dumps(line), 1)
    item = RequestItem.of(request)

    engine_request = item.engine_request(DEFAULTS)

    assert engine_request.generation == request.generation(DEFAULTS)
    assert engine_request.id == line["custom_id"]
    assert engine_request.prompt == request.prompt
    assert engine_request.chat_template is (False if line.get("url") == "/v1/completions" else None)
    assert request.engine_request(DEFAULTS) == engine_request  # an online request's way, without a chunk item


def test_an_item_without_settings_of_its_own_runs_with_the_run_defaults():
    item = RequestItem("k", prompt="x")
    assert item.settings == "" and RequestItem.of(parse_request_line('{"prompt": "x"}', 1)).settings == ""
    assert item.generation(DEFAULTS) is DEFAULTS
    own = RequestItem("k", settings='{"temperature": 0.0}')
    assert own.generation(DEFAULTS) == GenerationConfig(64, 0.0, 0.8, (), 5)


def test_an_out_of_range_setting_fails_when_the_item_becomes_a_config():
    with pytest.raises(ValueError, match="top_p must be in"):
        RequestItem("k", settings='{"top_p": 2.0}').generation(DEFAULTS)


def test_items_with_and_without_their_own_settings_cross_flyte_unchanged(run_locally):
    items = [RequestItem.of(parse_request_line(json.dumps(line), number)) for number, line in enumerate(LINES, start=1)]
    items.append(RequestItem("empty-stop", messages=[ChatMessage("user", "x")], settings='{"stop": []}'))
    chunk = RequestChunk(3, items)

    assert run_locally(through_flyte, chunk=chunk) == chunk


def test_a_schema_crosses_as_text_with_its_key_order_and_name():
    item = RequestItem.of(parse_request_line(json.dumps(LINES[5]), 6))
    response_format = item.engine_request(DEFAULTS).generation.response_format

    assert json.loads(item.settings)["response_format"]["name"] == "s"
    assert response_format == ResponseFormat.json_schema(SCHEMA, name="s")
    assert list(json.loads(response_format.schema)["properties"]) == ["b", "a"]  # the order the line wrote


def test_every_sample_survives_the_result_and_comes_back_as_one_completion():
    samples = [Sample("red", 2, "stop"), Sample("deep blue", 3, "length"), Sample("green", 2, "stop")]
    completion = Completion.from_samples(11, samples)

    result = ItemResult.of("k", completion)

    assert (result.text, result.finish_reason, result.completion_tokens) == ("red", "stop", 7)
    assert result.completion() == completion
    single = Completion("hi", 4, 1, "stop")
    assert ItemResult.of("k", single).samples == [] and ItemResult.of("k", single).completion() == single


def test_a_mixed_stream_is_cut_into_chunks_of_one_kind_numbered_as_they_fill():
    cutter = ChunkCutter(chunk_size=2, embedding_chunk_texts=3, order="file")
    texts = {"e1": ["a", "b"], "e2": ["c"], "e3": ["d"]}
    order = ["g1", "e1", "g2", "e2", "g3", "e3"]
    full = []
    for number, key in enumerate(order, start=1):
        if key in texts:
            line = {"custom_id": key, "method": "POST", "url": "/v1/embeddings", "body": {"input": texts[key]}}
        else:
            line = {"custom_id": key, "prompt": key}
        full += cutter.add(parse_request_line(json.dumps(line), number, endpoints=ENDPOINTS))
    rest = cutter.rest()

    assert [(type(chunk).__name__, chunk.index, [item.key for item in chunk.items]) for chunk in full + rest] == [
        ("RequestChunk", 0, ["g1", "g2"]),
        ("EmbeddingChunk", 1, ["e1", "e2"]),  # three texts
        ("RequestChunk", 2, ["g3"]),
        ("EmbeddingChunk", 3, ["e3"]),
    ]
    assert rest[1].items[0].inputs == ["d"]
