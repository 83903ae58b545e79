"""Prompt records' prefix keys: they begin alike where the prompts the engine renders do, so that an engine's
batcher with `grouping="by_prefix"` sends prompts that share a prefix to the model together."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flyteplugins_batcher import Prompt
from flyteplugins_batcher._pipeline.grouping import common_prefix_length
from flyteplugins_batcher.engines import Completion, GenerationConfig, PreparedPrompt, Request
from flyteplugins_batcher.engines._prompts import prompt_prefix_key
from tests.engines.test_base import TemplatedEchoEngine


def chat(document: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Answer from {document}."}, {"role": "user", "content": question}]


def test_a_plain_prompt_is_its_own_key_and_a_non_prompt_has_none():
    assert prompt_prefix_key("Summarize: ...") == "Summarize: ..."
    assert prompt_prefix_key(Prompt("Once upon")) == "Once upon" == Prompt("Once upon").prefix_key()
    assert prompt_prefix_key(Request("Once upon", id="r-1")) == "Once upon"
    assert prompt_prefix_key(42) is None and prompt_prefix_key([1, 2]) is None and prompt_prefix_key(b"x") is None


def test_chat_keys_share_what_their_conversations_share_in_order():
    first, second = prompt_prefix_key(chat("doc A", "Who?")), prompt_prefix_key(chat("doc A", "When?"))
    other = prompt_prefix_key(chat("doc B", "Who?"))
    assert first is not None and second is not None and other is not None
    system_only = prompt_prefix_key(chat("doc A", "Who?")[:1])
    assert first.startswith(system_only) and second.startswith(system_only)
    assert common_prefix_length(first, second) > common_prefix_length(first, other)
    # The role is part of the prompt: the same text from another role is another prefix.
    as_user = prompt_prefix_key([{"role": "user", "content": "Answer from doc A."}])
    assert not first.startswith(as_user)


def test_the_adapter_comes_first_since_another_adapters_cache_is_of_no_use():
    messages = chat("doc A", "Who?")
    sql = Request(messages, adapter="sql").prefix_key()
    sql_later = Request(chat("doc A", "When?"), adapter="sql").prefix_key()
    other_adapter = Request(messages, adapter="chat").prefix_key()
    base = Request(messages).prefix_key()
    assert sql is not None and sql_later is not None and other_adapter is not None and base is not None
    assert sql == "\x1dsql\x1d" + base and base == prompt_prefix_key(messages)
    assert common_prefix_length(sql, other_adapter) == 1  # the mark before an adapter's name, and nothing else
    assert common_prefix_length(sql, sql_later) > len("\x1dsql\x1d") and common_prefix_length(sql, base) == 0


class HeldEngine(TemplatedEchoEngine):
    """Its first batch waits until released, so that the records submitted meanwhile wait together."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entered = threading.Event()
        self.release = threading.Event()

    def _run(self, prompts: list[PreparedPrompt]) -> list[Completion | Exception]:
        if not self.calls:
            self.entered.set()
            self.release.wait(5)
        return super()._run(prompts)


@pytest.mark.parametrize("grouping", ["by_prefix", "fifo"])
async def test_its_batcher_sends_the_questions_on_one_document_together(grouping: str):
    engine = HeldEngine(generation=GenerationConfig(max_new_tokens=2))
    engine.load()
    documents = ["d1", "d2", "d3"]
    records = [chat(document, f"q{question}") for question in range(3) for document in documents]
    async with engine.batcher(grouping=grouping, max_batch_size=3) as batcher:
        blocker = await batcher.submit("hi")
        assert await asyncio.to_thread(engine.entered.wait, 5)
        futures = await batcher.submit_batch(records)
        engine.release.set()
        await asyncio.gather(blocker, *futures)
    rendered = [["".join(map(chr, prompt.token_ids)) for prompt in call] for call in engine.calls[1:]]
    assert rendered[0][0] == "[system]Answer from d1.[user]q0>"
    by_document = [{text[len("[system]Answer from ") :][:2] for text in call} for call in rendered]
    if grouping == "by_prefix":
        assert by_document == [{"d1"}, {"d2"}, {"d3"}]
    else:  # the same records in file order: every batch holds every document
        assert by_document == [set(documents)] * 3


def test_vllms_batch_mode_groups_by_prefix_and_stream_mode_sends_records_as_they_come() -> None:
    from flyteplugins_batcher.engines.vllm import VLLMEngine, VLLMStreamEngine

    assert VLLMEngine("any-model").batcher_defaults().grouping == "by_prefix"  # batches: a group's records together
    assert VLLMStreamEngine("any-model").batcher_defaults().max_batch_size == 1  # one at a time: grouping moot
