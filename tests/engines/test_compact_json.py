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
    own = with_compact_json({"structured_outputs_config": {"backend": "guidance"}})["structured_outputs_config"]
    assert (own.backend, own.disable_any_whitespace) == ("guidance", False)  # the user's own config wins


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
