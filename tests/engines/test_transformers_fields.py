"""The Transformers engine's request fields against Transformers' own `generate` and `peft` on the same prompts:
logprobs, LoRA adapters beside the base model in one batch, structured output beyond JSON, logit bias, penalties,
chat template keywords."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from flyteplugins_batcher.engines import Completion, GenerationConfig, Request, ResponseFormat

pytestmark = [pytest.mark.slow, pytest.mark.engine_starts(3)]  # the engine, the reference, the adapters

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def engine(lora_adapters: dict[str, str]) -> Iterator[Any]:
    """The bundled SmolLM2 on CPU with both adapters, greedy."""
    from flyteplugins_batcher.engines.transformers import TransformersEngine

    loaded = TransformersEngine(
        device="cpu", generation=GenerationConfig(max_new_tokens=MAX_NEW_TOKENS), lora_modules=lora_adapters
    )
    loaded.load()
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def reference() -> Any:
    """The same checkpoint through plain Transformers, as a user loads it."""
    import torch
    from transformers import AutoModelForCausalLM

    from flyteplugins_batcher.engines import bundled_smollm2_path

    return AutoModelForCausalLM.from_pretrained(str(bundled_smollm2_path()), dtype=torch.float32).eval()


def generated(model: Any, prompt_ids: list[int], **options: Any) -> Any:
    """Greedy `generate` of one prompt with its raw logits (what vLLM's `raw_logprobs` reports)."""
    import torch

    with torch.inference_mode():
        return model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
            **options,
        )


def answers(engine: Any, records: list[Request]) -> list[Completion]:
    outcomes = engine.generate(records)
    assert all(isinstance(outcome, Completion) for outcome in outcomes), outcomes
    return outcomes


def test_logprobs_are_the_models_own_as_generate_reports_them(engine: Any, reference: Any) -> None:
    import torch

    [answer] = answers(engine, [Request(QUESTION, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, logprobs=3))])
    ids = engine.prompt_ids(Request(QUESTION))
    output = generated(reference, ids, eos_token_id=sorted(engine._eos_token_ids), pad_token_id=engine._pad_token_id)
    tokens = output.sequences[0, len(ids) :].tolist()
    logprobs = answer.samples[0].logprobs
    assert logprobs is not None and len(logprobs) == answer.completion_tokens == len(tokens)
    for position, (token, item) in enumerate(zip(tokens, logprobs, strict=True)):
        expected = torch.log_softmax(output.logits[position][0].float(), dim=-1)
        assert item.token == engine._tokenizer.decode([token])
        assert item.logprob == pytest.approx(float(expected[token]), abs=1e-4)
        best = expected.topk(3)
        assert [engine._tokenizer.decode([i]) for i in best.indices.tolist()] == [t for t, _ in item.top]
        assert [value for _, value in item.top] == pytest.approx(best.values.tolist(), abs=1e-4)
    assert logprobs[-1].token == "<|im_end|>" and answer.finish_reason == "stop"  # EOS counted, as vLLM counts it


def test_adapter_rows_equal_peft_alone_and_base_rows_beside_them_equal_the_base_model(
    engine: Any, reference: Any, lora_adapters: dict[str, str]
) -> None:
    from peft import PeftModel

    config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS)
    mixed = [
        Request(QUESTION, config),
        Request(QUESTION, config, adapter="alpha"),
        Request(QUESTION, config, adapter="beta"),
    ]
    base, alpha, beta = answers(engine, mixed)
    ids = engine.prompt_ids(Request(QUESTION))
    stop = {"eos_token_id": sorted(engine._eos_token_ids), "pad_token_id": engine._pad_token_id}

    def text_of(model: Any) -> str:
        tokens = generated(model, ids, **stop).sequences[0, len(ids) :].tolist()
        return engine._tokenizer.decode(tokens, skip_special_tokens=True)

    assert base.text == text_of(reference)
    for answer, name in ((alpha, "alpha"), (beta, "beta")):
        with_adapter = PeftModel.from_pretrained(reference, lora_adapters[name]).eval()
        try:
            assert answer.text == text_of(with_adapter), name
        finally:
            with_adapter.unload()  # the reference model back as it was, for the next adapter
    assert len({base.text, alpha.text, beta.text}) == 3  # each adapter changes the answer


def test_choice_regex_and_grammar_are_obeyed(engine: Any) -> None:
    formats = {
        "choice": ResponseFormat.choice(["yes", "no", "maybe"]),
        "regex": ResponseFormat.regex(r"(19|20)\d\d"),
        "grammar": ResponseFormat.grammar('root ::= "The answer is " [0-9]+ "."'),
    }
    records = [Request(QUESTION, GenerationConfig(max_new_tokens=12, response_format=f)) for f in formats.values()]
    choice, regex, grammar = answers(engine, records)
    assert choice.text in ("yes", "no", "maybe")
    assert re.fullmatch(r"(19|20)\d\d", regex.text)
    assert re.fullmatch(r"The answer is [0-9]+\.", grammar.text), grammar.text


def test_a_logit_bias_moves_the_greedy_choice_to_the_next_best_token(engine: Any) -> None:
    plain = answers(engine, [Request(QUESTION, GenerationConfig(max_new_tokens=1, logprobs=2))])[0]
    logprobs = plain.samples[0].logprobs
    assert logprobs is not None
    (first, _), (second, _) = logprobs[0].top
    first_id = engine._tokenizer.encode(first, add_special_tokens=False)[0]
    biased = answers(engine, [Request(QUESTION, GenerationConfig(max_new_tokens=1, logit_bias={first_id: -100}))])[0]
    assert (plain.text, biased.text) == (first, second)


def test_a_presence_penalty_changes_what_repeats(engine: Any) -> None:
    count = [{"role": "user", "content": "Repeat the word 'yes' ten times."}]
    free, penalised = answers(
        engine,
        [
            Request(count, GenerationConfig(max_new_tokens=16)),
            Request(count, GenerationConfig(max_new_tokens=16, presence_penalty=2.0, frequency_penalty=2.0)),
        ],
    )
    assert free.text.lower().count("yes") > penalised.text.lower().count("yes")


def test_what_the_engine_cannot_honour_fails_its_record_naming_the_field_and_the_engine(engine: Any) -> None:
    bad_grammar, bad_bias = engine.generate(
        [
            Request(QUESTION, GenerationConfig(response_format=ResponseFormat.grammar("root ::= ("))),
            Request(QUESTION, GenerationConfig(logit_bias={10**7: 1.0})),
        ]
    )
    assert bad_grammar.code == bad_bias.code == "invalid_request"
    assert str(bad_grammar).startswith("transformers: record 0") and "structured_outputs.grammar" in str(bad_grammar)
    assert str(bad_bias).startswith("transformers: record 1") and "logit_bias" in str(bad_bias)


def test_chat_template_keywords_and_tools_reach_the_template(engine: Any) -> None:
    prompt = engine.render(Request(QUESTION, template_kwargs={"add_generation_prompt": False}))
    assert prompt.endswith("What is 2 + 2?<|im_end|>\n")
    assert engine.render(Request(QUESTION)).endswith("<|im_start|>assistant\n")
