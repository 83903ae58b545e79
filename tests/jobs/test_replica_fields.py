"""The request fields beyond text on their way through a replica: across the Flyte task boundary, on the simulated
engine (which honours them trivially or refuses them by name), and the LoRA and tool-parser settings."""

from __future__ import annotations

import json

import pytest
from flyte.types import TypeEngine

from flyteplugins_batcher.batch_api import BatchRequest, parse_request_line
from flyteplugins_batcher.engines import Completion, EngineConfigError, GenerationConfig, Sample, TokenLogprob
from flyteplugins_batcher.replica import ChunkOutcome, EngineSettings, ItemResult, LLMReplica, RequestChunk, RequestItem
from flyteplugins_batcher.replica._llm import engine_kwargs
from flyteplugins_batcher.replica._settings import parse_lora_modules
from flyteplugins_batcher.replica._snapshot import ReplicaSnapshot

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
SIMULATED = EngineSettings(
    engine="simulated",
    engine_args=json.dumps({"time_scale": 100, "output_lengths": {"mean": 6, "spread": 0}}),
    lora_modules="alpha=/nowhere/alpha",
)


def line(custom_id: str, **body: object) -> BatchRequest:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    text = json.dumps({"custom_id": custom_id, "url": "/v1/chat/completions", "body": {"messages": messages, **body}})
    request = parse_request_line(text, 1, served_model="m", adapters=("alpha",))
    assert isinstance(request, BatchRequest)
    return request


async def test_every_field_crosses_the_task_boundary_as_plain_dataclass_fields() -> None:
    request = line(
        "r1",
        model="alpha",
        logprobs=True,
        top_logprobs=2,
        guided_regex="[a-z]+",
        logit_bias={"7": -5},
        presence_penalty=0.25,
        tools=TOOLS,
        tool_choice="none",
        chat_template_kwargs={"enable_thinking": False},
    )
    chunk = RequestChunk(3, [RequestItem.of(request)])

    literal = await TypeEngine.to_literal(chunk, RequestChunk, TypeEngine.to_literal_type(RequestChunk))
    back = await TypeEngine.to_python_value(literal, RequestChunk)

    record = back.items[0].engine_request(GenerationConfig(max_new_tokens=9))
    assert record.adapter == "alpha" and record.template_kwargs == {"enable_thinking": False}
    assert record.tools == TOOLS and record.prompt[1]["tool_calls"] == [CALL]
    assert record.prompt[2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}
    config = record.generation
    assert config is not None and (config.logprobs, config.presence_penalty, config.logit_bias) == (
        2,
        0.25,
        ((7, -5.0),),
    )
    assert config.response_format is not None and config.response_format.pattern == "[a-z]+"
    assert config == request.generation(GenerationConfig(max_new_tokens=9))
    assert record == request.engine_request(GenerationConfig(max_new_tokens=9))  # the online way, without the chunk


async def test_an_answers_logprobs_cross_back_with_it() -> None:
    tokens = (TokenLogprob("Hi", -0.5, (("Hi", -0.5), ("Hey", -1.25))), TokenLogprob("!", -0.125))
    completion = Completion.from_samples(4, [Sample("Hi!", 2, "stop", tokens)])
    outcome = ChunkOutcome(0, [ItemResult.of("r1", completion)], ReplicaSnapshot(replica="a"), finished_at=1.0)

    literal = await TypeEngine.to_literal(outcome, ChunkOutcome, TypeEngine.to_literal_type(ChunkOutcome))
    back = await TypeEngine.to_python_value(literal, ChunkOutcome)

    assert back.results[0].completion() == completion
    assert ItemResult.of("plain", Completion("x", 1, 1, "stop")).samples == []  # nothing extra without logprobs


async def test_the_simulated_engine_honours_logprobs_and_adapters_and_refuses_the_rest_by_name() -> None:
    replica = LLMReplica()
    requests = [
        line("logprobs", model="alpha", logprobs=True, top_logprobs=1),
        line("regex", structured_outputs={"regex": "[0-9]+"}),
        line("bias", logit_bias={"5": 3}, frequency_penalty=1),
    ]
    try:
        outcome = await replica.run_chunk(RequestChunk(0, [RequestItem.of(r) for r in requests]), SIMULATED)
    finally:
        await replica.aclose()
    answered, regex, bias = outcome.results
    [sample] = answered.completion().samples
    assert sample.logprobs is not None and len(sample.logprobs) == sample.completion_tokens == 6
    assert "".join(item.token for item in sample.logprobs) == sample.text
    assert all(item.logprob == 0.0 and item.top == ((item.token, 0.0),) for item in sample.logprobs)
    assert (regex.error_code, bias.error_code) == ("invalid_request", "invalid_request")
    assert regex.error_message.endswith("structured_outputs.regex cannot be honoured by the simulated engine")
    assert bias.error_message.endswith("frequency_penalty, logit_bias cannot be honoured by the simulated engine")


def test_lora_modules_are_read_in_each_of_vllms_forms() -> None:
    assert parse_lora_modules("a=/x b=/y\nc=/z") == {"a": "/x", "b": "/y", "c": "/z"}
    assert parse_lora_modules('{"name": "a", "path": "/with space"}\nb=/y') == {"a": "/with space", "b": "/y"}
    assert parse_lora_modules('[{"name": "a", "path": "/x", "base_model_name": "m"}]') == {"a": "/x"}
    assert parse_lora_modules("") == {}
    for text, message in [("a=/x a=/y", "names the adapter 'a' twice"), ("nameonly", "is neither name=path")]:
        with pytest.raises(EngineConfigError, match=message):
            parse_lora_modules(text)


def test_the_adapters_reach_every_engine_that_takes_them() -> None:
    adapters = {"lora_modules": {"alpha": "/a"}}
    assert engine_kwargs(EngineSettings(engine="transformers", lora_modules="alpha=/a")) == adapters
    assert engine_kwargs(EngineSettings(engine="vllm", lora_modules="alpha=/a")) == adapters
    assert engine_kwargs(EngineSettings(engine="simulated", lora_modules="alpha=/a")) == adapters


def test_a_responses_lines_bad_schema_fails_naming_text_format_after_the_task_boundary() -> None:
    # A valid JSON schema no value can follow: only the grammar compiler refuses it, as the record runs on a replica.
    pytest.importorskip("xgrammar", reason="needs xgrammar (the grammar compiler)")
    from flyteplugins_batcher.engines import InvalidResponseFormatError
    from flyteplugins_batcher.engines._structured import check_generation

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}
    body = {"input": "Pick a number.", "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema}}}
    text = json.dumps({"custom_id": "r", "url": "/v1/responses", "body": body})
    request = parse_request_line(text, 1, served_model="m")
    assert isinstance(request, BatchRequest)
    generation = RequestItem.of(request).engine_request(GenerationConfig()).generation
    assert generation is not None and generation.response_format is not None
    with pytest.raises(InvalidResponseFormatError) as raised:
        check_generation(generation)
    assert str(raised.value).startswith("text.format json_schema 'answer' cannot be enforced: Invalid range")
    assert "response_format" not in str(raised.value)  # the Chat field it is converted to is not what the line wrote
