"""The engine interface's shared logic: record validation, rendering, and the token-estimate fallback."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from flyteplugins_batcher import Prompt
from flyteplugins_batcher.engines import Completion, Engine, GenerationConfig, InvalidPromptError


class NoTokenizerEngine(Engine):
    """An engine whose tokenizer is unavailable (say, not loaded yet): exercises the fallbacks."""

    name = "no-tokenizer"

    def _load(self) -> None:
        pass

    @property
    def context_length(self) -> int:
        return 2048

    def tokenize(self, text: str) -> list[int]:
        raise RuntimeError("no tokenizer loaded")

    def _has_chat_template(self) -> bool:
        return False

    def _apply_chat_template(self, messages: list[Mapping[str, str]]) -> str:
        raise AssertionError("never called without a template")

    def generate(self, records):
        return [Completion(str(record), 0, 0, "stop") for record in records]


def test_without_a_tokenizer_the_estimate_falls_back_to_four_characters_per_token():
    engine = NoTokenizerEngine(generation=GenerationConfig(max_new_tokens=10))
    assert engine.estimate_tokens("x" * 40) == 40 // 4 + 1 + 10
    assert engine.estimate_tokens(Prompt("y" * 8)) == Prompt("y" * 8).estimate_tokens() + 10


def test_a_record_that_cannot_run_costs_one_token_and_fails_later():
    engine = NoTokenizerEngine()
    assert engine.estimate_tokens("") == 1
    assert engine.estimate_tokens(42) == 1  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ("   ", "empty prompt"),
        ([], "no messages"),
        ([{"content": "hi"}], "'role'"),
        (b"bytes", "got bytes"),
        (3.5, "got float"),
    ],
)
def test_render_names_what_is_wrong_with_a_record(record, message):
    with pytest.raises(InvalidPromptError, match=message):
        NoTokenizerEngine().render(record)


def test_without_a_chat_template_the_system_prompt_is_prepended_and_chats_are_refused():
    engine = NoTokenizerEngine(system_prompt="Be brief.")
    assert engine.render("What is 2 + 2?") == "Be brief.\n\nWhat is 2 + 2?"
    with pytest.raises(InvalidPromptError, match="need a chat template"):
        engine.render([{"role": "user", "content": "hi"}])


def test_generation_config_validates_and_normalizes():
    assert GenerationConfig(stop="###").stop == ("###",)
    assert GenerationConfig().greedy and not GenerationConfig(temperature=0.7).greedy
    for bad in ({"max_new_tokens": 0}, {"temperature": -1}, {"top_p": 0}):
        with pytest.raises(ValueError):
            GenerationConfig(**bad)
