"""Structured output and several samples with the real Transformers engine (bundled SmolLM2 on CPU)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from benchmarks.structured_cases import Validity, held_out_cases, held_out_requests, invalid_reason
from flyteplugins_batcher.engines import (
    Completion,
    GenerationConfig,
    InvalidResponseFormatError,
    Request,
    ResponseFormat,
)

if TYPE_CHECKING:
    from flyteplugins_batcher.engines.transformers import TransformersEngine

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Invent a person: their name and age."}]


def test_a_schema_a_json_object_and_a_plain_record_share_one_generate_call(smollm2_engine: TransformersEngine):
    case = held_out_cases()[0]
    schema_format = ResponseFormat.json_schema(case["schema"], name=case["name"])
    records = [
        Request(CHAT, GenerationConfig(max_new_tokens=96, response_format=schema_format), id="schema"),
        Request(CHAT, GenerationConfig(max_new_tokens=96, response_format=ResponseFormat.json_object()), id="object"),
        Request(CHAT, GenerationConfig(max_new_tokens=96), id="plain"),
    ]
    [plain_alone] = smollm2_engine.generate([records[2]])
    passes_before = smollm2_engine.stats.batches
    schema_answer, object_answer, plain = smollm2_engine.generate(records)
    assert smollm2_engine.stats.batches == passes_before + 1  # one left-padded generate call for all three
    assert isinstance(schema_answer, Completion) and schema_answer.finish_reason == "stop"
    assert invalid_reason(schema_answer.text, schema_format) is None, schema_answer.text
    assert isinstance(object_answer, Completion)
    if object_answer.finish_reason == "stop":
        assert isinstance(json.loads(object_answer.text), dict)
    else:  # SmolLM2 may talk on inside a key until max_new_tokens: what it wrote is still held to the grammar
        assert accepted_so_far(object_answer.text, ResponseFormat.json_object()), object_answer.text
    assert isinstance(plain, Completion) and isinstance(plain_alone, Completion)
    assert plain.text == plain_alone.text  # the unconstrained row is left alone by the grammar processor


def accepted_so_far(text: str, response_format: ResponseFormat) -> bool:
    """Whether `text` is the start of an answer the format's (compact) grammar accepts."""
    from transformers import AutoTokenizer

    from flyteplugins_batcher.engines import bundled_smollm2_path
    from flyteplugins_batcher.engines._structured import Grammars

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_smollm2_path()))
    grammars = Grammars(tokenizer, len(tokenizer), stop_token_ids=[tokenizer.eos_token_id])
    return bool(grammars.matcher(response_format).accept_string(text))


def test_an_invalid_schema_fails_alone_and_the_others_still_answer(smollm2_engine: TransformersEngine):
    broken = ResponseFormat.json_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, name="x")
    records = [
        Request(CHAT, GenerationConfig(max_new_tokens=48, response_format=ResponseFormat.json_object())),
        Request(CHAT, GenerationConfig(max_new_tokens=48, response_format=broken), id="broken"),
        Request(CHAT, GenerationConfig(max_new_tokens=8)),
    ]
    first, error, last = smollm2_engine.generate(records)
    assert isinstance(first, Completion) and isinstance(last, Completion)
    assert isinstance(error, InvalidResponseFormatError)
    assert "id='broken'" in str(error) and "json_schema 'x' cannot be enforced: Cannot find field $defs" in str(error)


def test_a_json_answer_cut_by_max_tokens_says_length(smollm2_engine: TransformersEngine):
    generation = GenerationConfig(max_new_tokens=5, response_format=ResponseFormat.json_object())
    [cut] = smollm2_engine.generate([Request(CHAT, generation)])
    assert isinstance(cut, Completion) and cut.finish_reason == "length" and cut.completion_tokens == 5


def test_n_samples_are_all_returned_and_counted(smollm2_engine: TransformersEngine):
    sampled = Request("Name a color.", GenerationConfig(max_new_tokens=12, temperature=1.0, n=3, seed=7))
    greedy = Request("Name a color.", GenerationConfig(max_new_tokens=12, n=3))
    single = Request("Name a color.", GenerationConfig(max_new_tokens=12))
    completions = smollm2_engine.generate([sampled, greedy, single])
    assert all(isinstance(completion, Completion) for completion in completions)
    several, identical, one = completions
    assert isinstance(several, Completion) and isinstance(identical, Completion) and isinstance(one, Completion)
    assert len(several.samples) == 3 and len({sample.text for sample in several.samples}) > 1
    assert several.completion_tokens == sum(sample.completion_tokens for sample in several.samples)
    assert several.prompt_tokens == one.prompt_tokens
    assert [sample.text for sample in identical.samples] == [one.text] * 3
    assert identical.completion_tokens == 3 * one.completion_tokens
    [again] = smollm2_engine.generate([sampled])
    assert isinstance(again, Completion) and again.samples == several.samples  # the seed repeats the samples


def test_n_samples_with_a_schema_and_top_p_each_follow_it(
    smollm2_engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(smollm2_engine, "micro_batch_size", 2)  # 3 samples need their own pass: never split
    case = held_out_cases()[1]
    schema_format = ResponseFormat.json_schema(case["schema"], name=case["name"])
    # top-p is applied after the grammar mask (see grammar_processor), so a cut never leaves no token at all
    generation = GenerationConfig(
        max_new_tokens=96, temperature=0.8, top_p=0.9, n=3, seed=1, response_format=schema_format
    )
    [completion] = smollm2_engine.generate([Request([{"role": "user", "content": case["prompt"]}], generation)])
    assert isinstance(completion, Completion) and len(completion.samples) == 3
    for sample in completion.samples:
        if sample.finish_reason == "stop":
            assert invalid_reason(sample.text, schema_format) is None, sample.text


@pytest.mark.timeout(600)  # 10 answers of up to 256 tokens on 2 shared CPU cores
def test_every_answered_held_out_schema_validates(smollm2_engine: TransformersEngine):
    # Greedy here; the sampled answers too (30 in all) in `benchmarks/bench_structured.py`, which gives the table.
    validity = Validity()
    requests = held_out_requests()
    validity.add(requests, smollm2_engine.generate(requests))
    print(validity.summary("transformers"))
    assert not validity.failures, validity.failures
    assert validity.answered >= len(held_out_cases()) - 2  # most answers finish within the budget
