"""The vLLM engines' request fields, in both modes, against real vLLM (its CPU build) with two peft LoRA adapters:
logprobs (streamed with the text in stream mode), adapters beside the base model in one batch, structured output
beyond JSON, logit bias and penalties, and what vLLM refuses, per record."""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")

from flyteplugins_batcher.engines import (
    Completion,
    GenerationConfig,
    InvalidPromptError,
    Request,
    ResponseFormat,
    TokenLogprob,
    create_engine,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine_starts(2)]  # a mode's engine, the session's adapters

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
GREEDY = GenerationConfig(max_new_tokens=12, logprobs=2)


@pytest.fixture(scope="module", params=["batch", "stream"])
def engine(request: pytest.FixtureRequest, lora_adapters: dict[str, str]) -> Iterator[Any]:
    loaded = create_engine(
        "vllm",
        mode=request.param,
        generation=GenerationConfig(max_new_tokens=12),
        lora_modules=lora_adapters,
        max_model_len=1024,
        kv_cache_memory_bytes=1 << 30,
        max_num_seqs=8,
        dtype="float32",  # bfloat16 (vLLM's choice on a CPU with AVX512-BF16) ties and moves logprobs by batch
    )
    loaded.load()
    yield loaded
    loaded.close()


async def generate(engine: Any, records: list[Request]) -> list[Any]:
    result = engine.generate(records)
    return await result if inspect.isawaitable(result) else result


async def test_base_rows_beside_adapter_rows_answer_as_the_base_model_alone(engine: Any) -> None:
    [alone] = await generate(engine, [Request(QUESTION, GREEDY)])
    base, alpha, beta, again = await generate(
        engine,
        [
            Request(QUESTION, GREEDY),
            Request(QUESTION, GREEDY, adapter="alpha"),
            Request(QUESTION, GREEDY, adapter="beta"),
            Request(QUESTION, GREEDY),
        ],
    )
    assert base.text == again.text == alone.text
    assert [item.logprob for item in base.samples[0].logprobs] == pytest.approx(
        [item.logprob for item in alone.samples[0].logprobs], abs=1e-3
    )
    assert len({alone.text, alpha.text, beta.text}) == 3
    lora = engine._vllm_config.lora_config
    assert (lora.max_loras, lora.max_lora_rank) == (3, 8)  # a slot each, and on CPU one more that stays empty


async def test_logprobs_count_every_token_with_the_best_alternatives(engine: Any) -> None:
    [answer] = await generate(engine, [Request(QUESTION, GREEDY)])
    logprobs = answer.samples[0].logprobs
    assert isinstance(answer, Completion) and logprobs is not None
    assert len(logprobs) == answer.completion_tokens and "".join(i.token for i in logprobs).startswith(answer.text)
    for item in logprobs:
        assert len(item.top) == 2 and item.top[0] == (item.token, pytest.approx(item.logprob))  # greedy
        assert item.top[0][1] >= item.top[1][1]


async def test_choice_regex_grammar_logit_bias_and_penalties_apply_per_record(engine: Any) -> None:
    [plain] = await generate(engine, [Request(QUESTION, GenerationConfig(max_new_tokens=1, logprobs=2))])
    (first, _), (second, _) = plain.samples[0].logprobs[0].top
    first_id = engine.tokenize(first)[0]
    records = [
        Request(QUESTION, GenerationConfig(max_new_tokens=8, response_format=ResponseFormat.choice(["four", "five"]))),
        Request(QUESTION, GenerationConfig(max_new_tokens=8, response_format=ResponseFormat.regex("[0-9]{2}"))),
        Request(QUESTION, GenerationConfig(max_new_tokens=8, response_format=ResponseFormat.grammar('root ::= "ok"'))),
        Request(QUESTION, GenerationConfig(max_new_tokens=1, logit_bias={first_id: -100})),
        Request(QUESTION, GenerationConfig(max_new_tokens=12, presence_penalty=2.0, frequency_penalty=2.0)),
    ]
    choice, regex, grammar, biased, penalised = await generate(engine, records)
    assert choice.text in ("four", "five") and re.fullmatch("[0-9]{2}", regex.text) and grammar.text == "ok"
    assert (plain.text, biased.text) == (first, second)
    assert isinstance(penalised, Completion)


async def test_what_vllm_refuses_fails_its_record_alone(engine: Any) -> None:
    refused, fine = await generate(
        engine, [Request(QUESTION, GenerationConfig(logit_bias={10**7: 1.0})), Request(QUESTION, GREEDY)]
    )
    assert isinstance(refused, InvalidPromptError) and refused.code == "invalid_request"
    assert "logit_bias" in str(refused) and "refused by vLLM" in str(refused)
    assert isinstance(fine, Completion)


async def test_stream_mode_streams_each_pieces_logprobs_with_its_text(engine: Any) -> None:
    if engine.mode != "stream":
        pytest.skip("batch mode answers whole records")
    heard: list[tuple[str, tuple[TokenLogprob, ...]]] = []
    lock = threading.Lock()

    def listen(index: int, text: str, logprobs: tuple[TokenLogprob, ...]) -> None:
        with lock:
            heard.append((text, logprobs))

    [answer] = await generate(engine, [Request(QUESTION, GREEDY, adapter="alpha", on_delta=listen)])
    streamed = [item for _, logprobs in heard for item in logprobs]
    assert streamed == list(answer.samples[0].logprobs)
    assert "".join(text for text, _ in heard) == answer.text
