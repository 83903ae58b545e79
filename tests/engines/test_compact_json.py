"""Compact constrained output: JSON from a schema or a tool call is generated without free whitespace.

vLLM's `disable_any_whitespace` (its structured outputs' config, set by default here) and the
Transformers engine's xgrammar grammar with the same separators: `{"a":1,"b":[2,3]}`, never a
newline, an indent or a space between the JSON's tokens, on both engines, for the same schema.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flyteplugins_batcher.engines import GenerationConfig, Request, ResponseFormat, create_engine

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["name", "age", "tags", "address"],
}
PROMPT = "Describe a person as JSON, with their name, age, a few tags and their city."


def free_whitespace(text: str) -> list[str]:
    """The whitespace of a JSON text outside its strings (none in compact JSON)."""
    found, in_string, escaped = [], False, False
    for character in text:
        if in_string:
            in_string = escaped or character != '"'
            escaped = not escaped and character == "\\"
        elif character == '"':
            in_string = True
        elif character.isspace():
            found.append(character)
    return found


def test_free_whitespace_finds_only_what_lies_outside_strings():
    assert free_whitespace('{"a":"x y","b":[1,2]}') == []
    assert free_whitespace('{"a": "x y",\n  "b": [1, 2]}') == [" ", "\n", " ", " ", " ", " "]


def test_the_vllm_engines_structured_outputs_are_compact_unless_its_arguments_say_otherwise():
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    from flyteplugins_batcher.engines.vllm._args import with_compact_json

    config = with_compact_json({"max_model_len": 512})["structured_outputs_config"]
    assert (config.backend, config.disable_any_whitespace) == ("xgrammar", True)
    own = with_compact_json({"structured_outputs_config": {"backend": "guidance"}})
    config = own["structured_outputs_config"]
    assert (config.backend, config.disable_any_whitespace) == ("guidance", False)  # the user's own config wins
    assert "logits_processors" not in own  # and no forcing made for a grammar it does not compile


def test_vllm_gets_the_forced_tokens_processor_with_compact_json_but_not_beside_speculative_decoding():
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    from flyteplugins_batcher.engines.vllm._args import with_compact_json
    from flyteplugins_batcher.engines.vllm._forced_tokens import ForcedTokens

    processors = with_compact_json({"logits_processors": ["my.Processor"]})["logits_processors"]
    assert processors == ["my.Processor", ForcedTokens]  # after the user's own
    assert "logits_processors" not in with_compact_json({"speculative_config": {"method": "ngram"}})


@pytest.fixture(scope="module")
def grammars() -> Any:
    pytest.importorskip("xgrammar", reason="needs xgrammar (the grammar compiler)")
    from transformers import AutoTokenizer

    from flyteplugins_batcher.engines import bundled_smollm2_path
    from flyteplugins_batcher.engines._structured import Grammars

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_smollm2_path()))
    return Grammars(tokenizer, len(tokenizer), stop_token_ids=[tokenizer.eos_token_id])


def test_where_the_grammar_forces_the_text_tokens_that_split_it_finer_than_the_tokenizer_are_masked(grammars: Any):
    import torch

    from flyteplugins_batcher.engines._structured import forced_token, without_shorter

    tokenizer, lengths = grammars.tokenizer, torch.tensor(grammars.token_lengths)
    matcher = grammars.matcher(ResponseFormat.json_schema(SCHEMA))
    assert matcher.find_jump_forward_string() == '{"name":"'  # the schema forces its first key
    token = forced_token(matcher, tokenizer)
    assert token == tokenizer.encode('{"name":"')[0] and tokenizer.decode([token]) == '{"'
    [brace] = tokenizer.encode("{")
    logits = torch.zeros(len(lengths))
    kept = without_shorter(logits, lengths, token)
    assert kept[brace] == float("-inf") and kept[token] == 0  # '{' alone would split '{"' finer than the tokenizer
    assert bool((kept == 0).sum() > 1)  # longer tokens stay the model's to choose
    for piece in tokenizer.encode('{"name":"Ada","age":'):
        assert matcher.accept_token(piece)
    assert forced_token(matcher, tokenizer) is None  # a number is the model's to choose: nothing more is masked
    only_short = torch.full_like(logits, float("-inf"))
    only_short[brace] = 0.0
    assert torch.equal(without_shorter(only_short, lengths, token), only_short)  # never every token the grammar allows


def answer(engine: Any, generation: GenerationConfig) -> str:
    engine.load()
    try:
        [completion] = engine.generate([Request(PROMPT, generation)])
    finally:
        engine.close()
    return completion.text


@pytest.mark.slow
@pytest.mark.parametrize("engine_name", ["transformers", "vllm"])
def test_a_schemas_json_is_generated_without_free_whitespace(engine_name: str):
    if engine_name == "vllm":
        pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
        engine = create_engine("vllm", mode="batch", max_model_len=1024, kv_cache_memory_bytes=1 << 29)
    else:
        engine = create_engine("transformers", device="cpu")
    text = answer(engine, GenerationConfig(max_new_tokens=96, response_format=ResponseFormat.json_schema(SCHEMA)))
    assert free_whitespace(text) == [], text
    assert set(json.loads(text)) == {"name", "age", "tags", "address"}
