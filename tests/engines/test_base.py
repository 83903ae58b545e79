"""The engine pipeline every engine shares: validation, rendering, per-record settings, merging, counting.

A tiny engine with a character-level "tokenizer" and an echoing "model" exercises it without
loading anything; the real engines run through the same code in their own tests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from flyteplugins_batcher import Prompt
from flyteplugins_batcher.engines import (
    BatchEngine,
    Completion,
    EngineNotLoadedError,
    GenerationConfig,
    InvalidPromptError,
    LoadedModel,
    PreparedPrompt,
    Request,
)


class CharTokenizer:
    """One token per character; BOS (token 1) for plain text; no chat template."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(char) for char in text]


class EchoEngine(BatchEngine):
    """Answers each prompt with its text reversed; remembers the settings each call got."""

    name = "echo"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls: list[list[PreparedPrompt]] = []

    def _load(self) -> LoadedModel:
        return LoadedModel(CharTokenizer(), context_length=64)

    def _run(self, prompts: list[PreparedPrompt]) -> list[Completion | Exception]:
        self.calls.append(list(prompts))
        return [
            Completion("".join(chr(token) for token in prompt.token_ids[1:])[::-1], len(prompt.token_ids), 3, "stop")
            for prompt in prompts
        ]


def test_before_load_the_estimate_falls_back_to_four_characters_per_token():
    engine = EchoEngine(generation=GenerationConfig(max_new_tokens=10))
    assert engine.estimate_tokens("x" * 40) == 40 // 4 + 1 + 10
    assert engine.estimate_tokens(Prompt("y" * 8)) == Prompt("y" * 8).estimate_tokens() + 10
    engine.load()
    assert engine.estimate_tokens("x" * 40) == 41 + 10  # the tokenizer counts, once loaded


def test_a_record_that_cannot_run_costs_one_token_and_fails_later():
    engine = EchoEngine()
    engine.load()
    assert engine.estimate_tokens("") == 1
    assert engine.estimate_tokens(42) == 1  # type: ignore[arg-type]


def test_using_an_engine_before_load_is_one_clear_error():
    engine = EchoEngine()
    for use in (lambda: engine.generate(["hi"]), lambda: engine.tokenize("hi"), lambda: engine.context_length):
        with pytest.raises(EngineNotLoadedError, match="echo: the engine is not loaded; call load"):
            use()


def test_bad_records_fail_alone_in_one_message_format():
    engine = EchoEngine(generation=GenerationConfig(max_new_tokens=8))
    engine.load()
    results = engine.generate(["abc", "", Request("x" * 60, id="long-one"), 4.5, "de"])  # type: ignore[list-item]
    assert [result.text for result in results if isinstance(result, Completion)] == ["cba", "ed"]
    messages = [str(result) for result in results if isinstance(result, InvalidPromptError)]
    assert messages == [
        "echo: record 1 (''): empty prompt: the record has no text",
        f"echo: record 2 (id='long-one', '{'x' * 56}...): prompt is too long: "
        "61 prompt tokens + max_new_tokens 8 = 69 > context length 64",
        "echo: record 3 (4.5): a prompt record must be a str, a Prompt, chat messages or a Request; got float: 4.5",
    ]
    assert [prompt.index for prompt in engine.calls[0]] == [0, 4]  # invalid records never reach the model
    stats = engine.stats
    assert (stats.batches, stats.records, stats.failed_records) == (1, 2, 3)


def test_each_request_carries_its_own_settings_and_budget():
    engine = EchoEngine(generation=GenerationConfig(max_new_tokens=8))
    engine.load()
    short = GenerationConfig(max_new_tokens=2, temperature=0.5, seed=3)
    long = GenerationConfig(max_new_tokens=60)
    results = engine.generate([Request("abc", short), "abc", Request("abcdef", long)])
    assert [prompt.generation for prompt in engine.calls[0]] == [short, engine.generation]
    assert isinstance(results[2], InvalidPromptError) and "max_new_tokens 60" in str(results[2])
    assert engine.estimate_tokens(Request("abc", short)) == 4 + 2
    assert engine.estimate_tokens("abc") == 4 + 8


def test_stats_are_a_snapshot_and_can_be_reset():
    engine = EchoEngine(generation=GenerationConfig(max_new_tokens=8))
    before = time.time()
    engine.load()
    engine.generate(["abc"])
    snapshot = engine.stats
    engine.generate(["abc"])
    assert snapshot.records == 1 and engine.stats.records == 2
    assert engine.stats.load_time_s >= 0 and engine.stats.generate_time_s > 0
    assert before <= engine.stats.loaded_at <= time.time()  # when the load ended: a run places it in time
    load = (engine.stats.load_time_s, engine.stats.loaded_at)
    engine.reset_stats()
    assert engine.stats.records == 0 and (engine.stats.load_time_s, engine.stats.loaded_at) == load


class PrefixCachingEchoEngine(EchoEngine):
    """Echoes, and says it found each prompt but its last token in a prefix cache (as vLLM's `num_cached_tokens`)."""

    def _run(self, prompts: list[PreparedPrompt]) -> list[Completion | Exception]:
        answers = super()._run(prompts)
        return [replace(answer, cached_tokens=answer.prompt_tokens - 1) for answer in answers]


def test_stats_count_the_prompt_tokens_found_in_a_prefix_cache_as_they_count_prompt_tokens():
    engine = PrefixCachingEchoEngine(generation=GenerationConfig(max_new_tokens=8))
    engine.load()
    results = engine.generate(["abc", "", "hello"])  # BOS + the characters; the empty prompt fails, uncounted
    assert [(result.prompt_tokens, result.cached_tokens) for result in results if isinstance(result, Completion)] == [
        (4, 3),
        (6, 5),
    ]
    before = engine.stats
    assert (before.prompt_tokens, before.cached_tokens) == (10, 8) and before.as_dict()["cached_tokens"] == 8
    engine.generate(["xy"])
    assert (engine.stats.since(before).prompt_tokens, engine.stats.since(before).cached_tokens) == (3, 2)
    engine.reset_stats()
    assert engine.stats.cached_tokens == 0

    plain = EchoEngine(generation=GenerationConfig(max_new_tokens=8))  # without a prefix cache: 0
    plain.load()
    plain.generate(["abc"])
    assert (plain.stats.prompt_tokens, plain.stats.cached_tokens) == (4, 0)


def test_batcher_settings_come_from_the_engine_and_a_misspelt_override_fails_at_once():
    engine = EchoEngine()
    batcher = engine.batcher(max_batch_size=3, name="echoes")
    assert batcher.settings.max_batch_size == 3 and batcher.name == "echoes"
    with pytest.raises(TypeError, match="did you mean 'max_batch_size'"):
        engine.batcher(max_batchsize=3)


async def test_an_engines_batcher_takes_a_latency_target_per_priority():
    engine = EchoEngine(generation=GenerationConfig(max_new_tokens=4))
    engine.load()
    async with engine.batcher(latency_slo_s={1: 5.0}) as batcher:
        futures = [await batcher.submit(text, priority=1) for text in ("abc", "de", "f")]
        futures.append(await batcher.submit("gh"))  # priority 0: no target
        assert [completion.text for completion in await asyncio.gather(*futures)] == ["cba", "ed", "f", "hg"]
    slo = batcher.stats.slo
    assert batcher.settings.latency_slo_s == {1: 5.0} and slo is not None
    assert list(slo.by_priority) == [1] and (slo.completed, slo.met) == (3, 3)


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
        EchoEngine().render(record)


def test_without_a_chat_template_the_system_prompt_is_prepended_and_chats_are_refused():
    engine = EchoEngine(system_prompt="Be brief.")
    assert engine.render("What is 2 + 2?") == "Be brief.\n\nWhat is 2 + 2?"
    with pytest.raises(InvalidPromptError, match="need a chat template"):
        engine.render([{"role": "user", "content": "hi"}])


def test_generation_config_validates_and_normalizes():
    assert GenerationConfig(stop="###").stop == ("###",)
    assert GenerationConfig().greedy and not GenerationConfig(temperature=0.7).greedy
    for bad in ({"max_new_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"stop": ("",)}, {"seed": 1.5}):
        with pytest.raises(ValueError):
            GenerationConfig(**bad)


class TemplatedTokenizer(CharTokenizer):
    """A tokenizer with a chat template that wraps each message in brackets."""

    chat_template = "[role]content"

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, **_: object) -> str:
        return "".join(f"[{message['role']}]{message['content']}" for message in messages) + ">"


class TemplatedEchoEngine(EchoEngine):
    def _load(self) -> LoadedModel:
        return LoadedModel(TemplatedTokenizer(), context_length=64)


def test_a_request_with_chat_template_false_reaches_the_model_as_written_with_its_special_tokens():
    engine = TemplatedEchoEngine(system_prompt="be brief", generation=GenerationConfig(max_new_tokens=8))
    engine.load()
    assert engine.render("hi") == "[system]be brief[user]hi>"
    assert engine.prompt_ids("hi") == [ord(char) for char in "[system]be brief[user]hi>"]  # the template's tokens only
    raw = Request("Once upon", chat_template=False)
    assert engine.render(raw) == "Once upon"
    assert engine.prompt_ids(raw) == [1] + [ord(char) for char in "Once upon"]  # BOS from the tokenizer
    assert engine.prompt_tokens(raw) == 10
    [completion] = engine.generate([raw])
    assert engine.calls[-1][0].token_ids == [1] + [ord(char) for char in "Once upon"]
    assert completion.text == "nopu ecnO"
