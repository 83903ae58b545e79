"""TransformersEngine against the real bundled SmolLM2-135M-Instruct (float32, CPU, greedy).

The model-free tests (stop-string trimming, model references, the cache directory, importing
without torch) run always; everything that loads the model is marked `slow`.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from flyteplugins_batcher import Prompt
from flyteplugins_batcher.engines import Completion, GenerationConfig, InvalidPromptError, Request
from flyteplugins_batcher.engines._completion import trim_at_stop
from flyteplugins_batcher.engines._model_reference import check_model_reference
from flyteplugins_batcher.engines._prompts import PromptRecord
from flyteplugins_batcher.engines._smollm2 import CACHE_DIR_ENV, cache_root, publish_directory

if TYPE_CHECKING:
    from flyteplugins_batcher.engines.transformers import TransformersEngine

# Different lengths on purpose: in a batch the shorter ones are left-padded by up to ~20 tokens.
PROMPTS = [
    "What is 2 + 2?",
    "Name three primary colors.",
    "Write one sentence about the ocean.",
    "Explain in one sentence why the sky is blue.",
    "List two prime numbers greater than ten.",
    "Translate 'good morning' into French.",
    "A train travels 60 miles in 1.5 hours. What is its average speed in miles per hour? Show your reasoning.",
    "Summarize the plot of Romeo and Juliet in one sentence, mentioning both families by name.",
]


def _completions(results: Sequence[Completion | Exception]) -> list[Completion]:
    assert all(isinstance(result, Completion) for result in results), results
    return [result for result in results if isinstance(result, Completion)]


@pytest.fixture(scope="module")
def alone(smollm2_engine: TransformersEngine) -> dict[str, Completion]:
    """Each prompt's greedy completion when it runs in a batch of one (no padding at all)."""
    return {prompt: _completions(smollm2_engine.generate([prompt]))[0] for prompt in PROMPTS}


# -- without the model ---------------------------------------------------------------------------


def test_trim_at_stop_cuts_at_the_earliest_stop_string() -> None:
    assert trim_at_stop("step 1\nstep 2. Done", ["Done", "\n"]) == ("step 1", "\n")  # the one that occurred first
    assert trim_at_stop("no stop here", ["###"]) == ("no stop here", None)
    assert trim_at_stop("", ["x"]) == ("", None)


@pytest.mark.parametrize("reference", ["HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "org/model.v1-2_b"])
def test_plausible_hub_ids_pass_the_early_check(reference: str) -> None:
    check_model_reference(reference)


@pytest.mark.parametrize("reference", ["./missing-model", "/no/such/dir", "~/nope/model", "weights.gguf"])
def test_missing_paths_fail_fast(reference: str) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_model_reference(reference)


@pytest.mark.parametrize("reference", ["two words", "org/na:me", "org--name", "-leading"])
def test_invalid_hub_ids_fail_fast(reference: str) -> None:
    with pytest.raises(ValueError, match="neither an existing path nor a Hugging Face hub id"):
        check_model_reference(reference)


def test_cache_root_prefers_explicit_then_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert cache_root() == tmp_path / "xdg" / "flyteplugins-batcher"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "flyteplugins-batcher"


def test_a_converted_checkpoint_is_published_atomically_and_a_concurrent_winner_is_kept(tmp_path: Path) -> None:
    # Stands in for the GGUF conversion, which publishes its checkpoint the same way.
    def write_checkpoint(directory: Path) -> None:
        (directory / "config.json").write_text('{"from": "model.gguf"}')

    target = tmp_path / "entry"
    threads = [threading.Thread(target=publish_directory, args=(target, write_checkpoint)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert (target / "config.json").read_text() == '{"from": "model.gguf"}'
    assert sorted(path.name for path in tmp_path.iterdir()) == ["entry"]  # no staging directories left


def test_engines_import_without_torch_transformers_or_vllm() -> None:
    script = """
import sys
for name in ("torch", "transformers", "vllm"):
    sys.modules[name] = None  # makes both `import` and importlib.util.find_spec see it as absent
import flyteplugins_batcher.engines as engines
import flyteplugins_batcher.engines.vllm as vllm
assert "VLLMEngine" in vllm.__all__
try:
    engines.create_engine("transformers")
except ImportError as error:
    print(error)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)

    assert "pip install 'flyteplugins-batcher[cpu]'" in result.stdout


# -- with the real model -------------------------------------------------------------------------


@pytest.mark.slow
def test_batch_returns_one_completion_per_record_in_input_order(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    forward = _completions(smollm2_engine.generate(PROMPTS[:4]))
    backward = _completions(smollm2_engine.generate(PROMPTS[:4][::-1]))

    assert len(forward) == len(backward) == 4
    assert [completion.text for completion in forward] == [alone[prompt].text for prompt in PROMPTS[:4]]
    assert backward == forward[::-1]
    assert all(completion.text.strip() for completion in forward)


@pytest.mark.slow
def test_greedy_completions_are_identical_alone_and_in_a_left_padded_batch_of_8(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    prompt_lengths = {smollm2_engine.prompt_tokens(prompt) for prompt in PROMPTS}
    assert len(prompt_lengths) > 4  # the batch really is padded

    batched = _completions(smollm2_engine.generate(PROMPTS))

    assert batched == [alone[prompt] for prompt in PROMPTS]  # text, token counts and finish reasons


@pytest.mark.slow
def test_token_counts_come_from_the_model_tokenizer(smollm2_engine: TransformersEngine) -> None:
    from transformers import AutoTokenizer

    from flyteplugins_batcher.engines import bundled_smollm2_path

    reference = AutoTokenizer.from_pretrained(bundled_smollm2_path())
    max_new_tokens = smollm2_engine.generation.max_new_tokens
    for prompt in PROMPTS[:3]:
        messages = [{"role": "user", "content": prompt}]
        expected = len(reference.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
        [completion] = _completions(smollm2_engine.generate([prompt]))

        assert smollm2_engine.prompt_tokens(prompt) == expected
        assert smollm2_engine.estimate_tokens(prompt) == expected + max_new_tokens
        assert completion.prompt_tokens == expected
        assert len(reference.encode(completion.text, add_special_tokens=False)) <= completion.completion_tokens


@pytest.mark.slow
def test_prompt_objects_and_chat_messages_render_like_plain_text(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    prompt = PROMPTS[0]
    records: list[PromptRecord] = [Prompt(text=prompt), [{"role": "user", "content": prompt}]]

    assert _completions(smollm2_engine.generate(records)) == [alone[prompt], alone[prompt]]


@pytest.mark.slow
def test_bad_records_fail_alone_with_a_message_naming_them(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    too_long = "word " * 9000
    results = smollm2_engine.generate([PROMPTS[0], "", 42, too_long, PROMPTS[1]])  # type: ignore[list-item]

    assert results[0] == alone[PROMPTS[0]]
    assert results[4] == alone[PROMPTS[1]]
    for index, fragment in [(1, "empty prompt"), (2, "got int: 42"), (3, "> context length 8192")]:
        error = results[index]
        assert isinstance(error, InvalidPromptError)
        assert str(error).startswith(f"transformers: record {index} (")
        assert fragment in str(error)
    assert "'word word word" in str(results[3])


@pytest.mark.slow
def test_max_new_tokens_ends_with_finish_reason_length(
    smollm2_engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(smollm2_engine, "generation", GenerationConfig(max_new_tokens=3))

    [completion] = _completions(smollm2_engine.generate([PROMPTS[7]]))

    assert completion.finish_reason == "length"
    assert completion.completion_tokens == 3


@pytest.mark.slow
def test_eos_ends_with_finish_reason_stop(smollm2_engine: TransformersEngine, alone: dict[str, Completion]) -> None:
    limit = smollm2_engine.generation.max_new_tokens
    finished = [completion for completion in alone.values() if completion.completion_tokens < limit]
    assert finished, "expected at least one short answer that ends with EOS"
    assert all(completion.finish_reason == "stop" for completion in finished)


@pytest.mark.slow
def test_stop_strings_trim_the_text(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion], monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = PROMPTS[7]
    full_text = alone[prompt].text
    stop = full_text.split()[3]  # a word the greedy answer is known to contain
    monkeypatch.setattr(smollm2_engine, "generation", GenerationConfig(max_new_tokens=24, stop=(stop,)))

    [completion] = _completions(smollm2_engine.generate([prompt]))

    assert completion.text == full_text[: full_text.index(stop)]
    assert completion.finish_reason == "stop"
    assert completion.completion_tokens < alone[prompt].completion_tokens


@pytest.mark.slow
def test_sampling_with_a_seed_repeats(smollm2_engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2_engine, "generation", GenerationConfig(max_new_tokens=12, temperature=1.0, seed=7))
    first = _completions(smollm2_engine.generate(PROMPTS[:2]))
    second = _completions(smollm2_engine.generate(PROMPTS[:2]))
    monkeypatch.setattr(smollm2_engine, "generation", GenerationConfig(max_new_tokens=12, temperature=1.0, seed=8))
    other_seed = _completions(smollm2_engine.generate(PROMPTS[:2]))

    assert first == second
    assert other_seed != first


@pytest.mark.slow
def test_stats_count_real_and_padded_positions(
    smollm2_engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    smollm2_engine.reset_stats()
    monkeypatch.setattr(smollm2_engine, "generation", GenerationConfig(max_new_tokens=4))
    short, long = PROMPTS[0], PROMPTS[6]

    completions = _completions(smollm2_engine.generate([short, long]))

    stats = smollm2_engine.stats
    width = max(completion.prompt_tokens for completion in completions)
    steps = max(completion.completion_tokens for completion in completions)
    assert stats.batches == 1 and stats.records == 2
    assert stats.real_tokens == sum(c.prompt_tokens + c.completion_tokens for c in completions)
    assert stats.padded_tokens == 2 * (width + steps)
    assert 0.5 < stats.padding_efficiency < 1.0


@pytest.mark.slow
def test_micro_batches_group_prompts_by_length(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(smollm2_engine, "micro_batch_size", 3)
    batches_before = smollm2_engine.stats.batches

    completions = _completions(smollm2_engine.generate(PROMPTS))

    assert smollm2_engine.stats.batches - batches_before == math.ceil(len(PROMPTS) / 3)
    assert completions == [alone[prompt] for prompt in PROMPTS]


@pytest.mark.slow
def test_generate_is_safe_from_several_threads(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    results: dict[int, list[Completion | Exception]] = {}

    def worker(slot: int) -> None:
        results[slot] = smollm2_engine.generate(PROMPTS[slot * 2 : slot * 2 + 2])

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results[0] == [alone[prompt] for prompt in PROMPTS[0:2]]
    assert results[1] == [alone[prompt] for prompt in PROMPTS[2:4]]


@pytest.mark.slow
def test_each_request_gets_its_own_settings_and_settings_never_share_a_call(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    prompt = PROMPTS[7]
    stop = alone[prompt].text.split()[3]
    short = GenerationConfig(max_new_tokens=3)
    stopped = GenerationConfig(max_new_tokens=24, stop=(stop,))
    batches_before = smollm2_engine.stats.batches

    results = _completions(
        smollm2_engine.generate([Request(prompt, short), prompt, Request(prompt, stopped, id="stops")])
    )

    assert results[1] == alone[prompt]  # the engine's own settings
    assert results[0].completion_tokens == 3 and results[0].finish_reason == "length"
    assert results[0].text and alone[prompt].text.startswith(results[0].text)  # the same greedy path, cut short
    assert results[2].text == alone[prompt].text[: alone[prompt].text.index(stop)]
    assert smollm2_engine.stats.batches - batches_before == 3  # three settings, three model.generate calls


@pytest.mark.slow
def test_a_request_longer_than_the_context_fails_alone(smollm2_engine: TransformersEngine) -> None:
    too_many = GenerationConfig(max_new_tokens=9000)
    results = smollm2_engine.generate([Request(PROMPTS[0], too_many, id="greedy"), PROMPTS[0]])
    assert isinstance(results[0], InvalidPromptError)
    assert "id='greedy'" in str(results[0]) and "max_new_tokens 9000" in str(results[0])
    assert isinstance(results[1], Completion)


@pytest.mark.slow
def test_the_engine_names_its_model_and_times_its_load(smollm2_engine: TransformersEngine) -> None:
    assert smollm2_engine.model_name == "SmolLM2-135M-Instruct"
    assert 0 < smollm2_engine.stats.load_time_s < 120
    assert smollm2_engine.is_healthy


# -- inside a TokenBatcher -----------------------------------------------------------------------


@pytest.mark.slow
async def test_concurrent_producers_each_get_their_own_answers(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    shares = [PROMPTS[producer::4] for producer in range(4)]

    async def producer(prompts: list[str]) -> list[Completion]:
        futures = [await batcher.submit(prompt) for prompt in prompts]
        return list(await asyncio.gather(*futures))

    async with smollm2_engine.batcher(max_batch_size=8, batch_timeout_s=0.5, min_batch_size=8) as batcher:
        answers = await asyncio.gather(*(producer(share) for share in shares))

    for share, got in zip(shares, answers, strict=True):
        assert got == [alone[prompt] for prompt in share]
    assert batcher.stats.total_batches == 1  # all eight ran together


@pytest.mark.slow
async def test_bad_records_fail_only_their_own_futures_in_the_batcher(
    smollm2_engine: TransformersEngine, alone: dict[str, Completion]
) -> None:
    records: list[object] = [PROMPTS[0], "", "word " * 9000, 3.5, PROMPTS[1]]
    # A budget above the too-long record's estimate keeps all five in one batch.
    options = {"max_batch_size": 8, "min_batch_size": 5, "batch_timeout_s": 0.5, "target_batch_tokens": 20_000}

    async with smollm2_engine.batcher(**options) as batcher:
        futures = [await batcher.submit(record) for record in records]  # type: ignore[arg-type]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)

    assert outcomes[0] == alone[PROMPTS[0]]
    assert outcomes[4] == alone[PROMPTS[1]]
    for index, fragment in [(1, "empty prompt"), (2, "prompt is too long"), (3, "got float: 3.5")]:
        assert isinstance(outcomes[index], InvalidPromptError)
        assert fragment in str(outcomes[index])
    assert batcher.stats.total_batches == 1
    assert batcher.stats.total_failed == 3


@pytest.mark.slow
async def test_its_batcher_puts_prompts_of_similar_length_together(smollm2_engine: TransformersEngine) -> None:
    short = [Request(text, GenerationConfig(max_new_tokens=2)) for text in ("Hi.", "Name a color.")]
    long = [Request(PROMPTS[6] + " " + PROMPTS[7], GenerationConfig(max_new_tokens=2)) for _ in range(2)]
    batch_costs: list[int] = []

    class BatchCosts:
        def on_dispatch(self, size: int, cost: int, reason: object, queue_waits_s: object) -> None:
            batch_costs.append(cost)

        def on_settled(self, outcome: object, latencies_s: object, failed: int) -> None:
            pass

    async with smollm2_engine.batcher(max_batch_size=2) as batcher:
        batcher.add_observer(BatchCosts())
        outcomes = await asyncio.gather(*await batcher.submit_batch([short[0], long[0], short[1], long[1]]))

    assert all(isinstance(outcome, Completion) for outcome in outcomes)
    # A padded batch costs its longest row: in arrival order each batch would hold a long prompt.
    pairs = [short, long]
    assert batch_costs == [sum(smollm2_engine.estimate_tokens(record) for record in pair) for pair in pairs]
