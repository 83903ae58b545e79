"""VLLMEngine in both modes, against the fake vLLM in tests/fakes (mirrors vLLM 0.33.0's API).

The fake model answers a prompt with its text reversed, one token per character, then EOS; its
tokenizer adds `<s>` (one token) for plain text, so "abc" is 4 prompt tokens and answers "cba"
in 4 tokens (3 characters + EOS).
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flyteplugins_batcher.engines._base import Completion, GenerationConfig, InvalidPromptError
from flyteplugins_batcher.engines._vllm import VLLMEngine

FAKES = Path(__file__).resolve().parents[1] / "fakes"


def _drop_vllm_modules() -> None:
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake `vllm` package, importable for this test only, with a fresh recorder."""
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FAKES))
    import vllm

    assert vllm.__file__ is not None and Path(vllm.__file__).is_relative_to(FAKES)
    yield vllm
    _drop_vllm_modules()


@pytest.fixture
def recorder(fake_vllm: ModuleType) -> Any:
    from vllm._testing import RECORDER

    return RECORDER


def _engine(mode: str = "batch", model: str = "fake/base", **kwargs: Any) -> VLLMEngine:
    kwargs.setdefault("max_model_len", 128)
    kwargs.setdefault("generation", GenerationConfig(max_new_tokens=32))
    engine = VLLMEngine(model, mode=mode, **kwargs)  # type: ignore[arg-type]
    engine.load()
    return engine


async def _generate(engine: VLLMEngine, records: list[Any]) -> list[Completion | Exception]:
    result = engine.generate(records)
    return await result if inspect.isawaitable(result) else result


def _texts(results: list[Completion | Exception]) -> list[str]:
    return [result.text if isinstance(result, Completion) else type(result).__name__ for result in results]


MODES = pytest.mark.parametrize("mode", ["batch", "stream"])


# -- both modes --------------------------------------------------------------------------------


@MODES
async def test_results_come_back_in_input_order(recorder: Any, mode: str) -> None:
    engine = _engine(mode)

    results = await _generate(engine, ["abc", "hello", "xy"])

    assert results == [
        Completion(text="cba", prompt_tokens=4, completion_tokens=4, finish_reason="stop"),
        Completion(text="olleh", prompt_tokens=6, completion_tokens=6, finish_reason="stop"),
        Completion(text="yx", prompt_tokens=3, completion_tokens=3, finish_reason="stop"),
    ]


@MODES
async def test_generation_config_maps_to_sampling_params(recorder: Any, mode: str) -> None:
    config = GenerationConfig(max_new_tokens=7, temperature=0.7, top_p=0.9, seed=11, stop=("zz", "\n\n"))
    engine = _engine(mode, generation=config)

    await _generate(engine, ["abc", "de"])

    if mode == "batch":
        [call] = recorder.generate_calls
        params = call.sampling_params
        assert call.use_tqdm is False
        assert call.prompts == [{"prompt_token_ids": [1, 100, 101, 102]}, {"prompt_token_ids": [1, 103, 104]}]
    else:
        assert [trace.prompt_token_ids for trace in recorder.requests] == [[1, 100, 101, 102], [1, 103, 104]]
        params = recorder.requests[0].sampling_params
        assert params.output_kind.name == "FINAL_ONLY"
    assert (params.n, params.temperature, params.top_p, params.seed) == (1, 0.7, 0.9, 11)
    assert (params.max_tokens, params.stop) == (7, ["zz", "\n\n"])


@MODES
async def test_greedy_config_gives_greedy_sampling(recorder: Any, mode: str) -> None:
    engine = _engine(mode, generation=GenerationConfig(max_new_tokens=5))

    await _generate(engine, ["abc"])

    params = recorder.generate_calls[0].sampling_params if mode == "batch" else recorder.requests[0].sampling_params
    assert (params.temperature, params.top_p, params.seed, params.max_tokens, params.stop) == (0.0, 1.0, None, 5, [])


@MODES
async def test_finish_reasons_map_to_stop_and_length(recorder: Any, mode: str) -> None:
    engine = _engine(mode, generation=GenerationConfig(max_new_tokens=3, stop=("l",)))

    eos, length, stop = await _generate(engine, ["ab", "abcdef", "hello"])

    assert eos == Completion(text="ba", prompt_tokens=3, completion_tokens=3, finish_reason="stop")
    assert length == Completion(text="fed", prompt_tokens=7, completion_tokens=3, finish_reason="length")
    # "olleh" stops at the first "l": the text excludes it, the token count includes it.
    assert stop == Completion(text="o", prompt_tokens=6, completion_tokens=2, finish_reason="stop")


@MODES
async def test_invalid_records_fail_alone_and_never_reach_vllm(recorder: Any, mode: str) -> None:
    engine = _engine(mode, max_model_len=64, generation=GenerationConfig(max_new_tokens=16))
    too_long = "x" * 48  # 49 prompt tokens + 16 new tokens > 64

    results = await _generate(engine, ["ok", "", 42, too_long, [{"role": "user", "content": "hi"}], "fine"])

    assert _texts(results) == ["ko", *["InvalidPromptError"] * 4, "enif"]
    messages = [str(result) for result in results[1:5]]
    assert messages[0].startswith("vllm: record 1 ('')") and "empty prompt" in messages[0]
    assert messages[1].startswith("vllm: record 2 (42)") and "got int" in messages[1]
    assert messages[2].startswith("vllm: record 3 ('xxxxxxxx")
    assert "49 prompt tokens + max_new_tokens=16 exceed the context length of 64" in messages[2]
    assert messages[3].startswith("vllm: record 4 ([{'role': 'user'") and "chat template" in messages[3]
    sent = (
        [prompt["prompt_token_ids"] for prompt in recorder.generate_calls[0].prompts]
        if mode == "batch"
        else [trace.prompt_token_ids for trace in recorder.requests]
    )
    assert sent == [[1, 114, 110], [1, 105, 108, 113, 104]]
    assert (engine.stats.records, engine.stats.failed_records, engine.stats.batches) == (2, 4, 1)


@MODES
async def test_a_batch_of_only_invalid_records_makes_no_vllm_call(recorder: Any, mode: str) -> None:
    engine = _engine(mode)

    results = await _generate(engine, ["", "   "])

    assert all(isinstance(result, InvalidPromptError) for result in results)
    assert (recorder.generate_calls, recorder.requests) == ([], [])
    assert (engine.stats.batches, engine.stats.failed_records) == (0, 2)


@MODES
async def test_chat_template_renders_system_prompt_with_a_single_bos(recorder: Any, mode: str) -> None:
    engine = _engine(
        mode, model="fake/tiny-instruct", system_prompt="Be brief.", generation=GenerationConfig(max_new_tokens=64)
    )
    expected_prompt = "<s><|system|>Be brief.\n<|user|>hi\n<|assistant|>"

    [result] = await _generate(engine, ["hi"])

    tokenizer = engine._tokenizer
    sent = (
        recorder.generate_calls[0].prompts[0]
        if mode == "batch"
        else {"prompt_token_ids": recorder.requests[0].prompt_token_ids}
    )
    assert tokenizer.decode(sent["prompt_token_ids"]) == expected_prompt
    assert isinstance(result, Completion)
    assert result.prompt_tokens == len(sent["prompt_token_ids"]) == 1 + len(expected_prompt) - len("<s>")
    assert result.text == ">|tnatsissa|<\nih>|resu|<\n.feirb eB>|metsys|<"


@MODES
async def test_stats_count_tokens_without_padding(recorder: Any, mode: str) -> None:
    engine = _engine(mode)

    await _generate(engine, ["abc", "hello"])
    await _generate(engine, ["xy", ""])

    stats = engine.stats
    assert (stats.batches, stats.records, stats.failed_records) == (2, 3, 1)
    assert (stats.prompt_tokens, stats.completion_tokens) == (4 + 6 + 3, 4 + 6 + 3)
    assert stats.real_tokens == stats.padded_tokens == 26
    assert stats.padding_efficiency == 1.0
    assert stats.generate_time_s > 0


@MODES
async def test_close_shuts_vllm_down_and_load_starts_it_again(recorder: Any, mode: str) -> None:
    engine = _engine(mode)

    engine.close()

    assert recorder.shutdowns == 1 and not engine.is_loaded
    with pytest.raises(RuntimeError, match=r"not loaded .* call load\(\) first"):
        await _generate(engine, ["abc"])
    engine.load()
    assert _texts(await _generate(engine, ["abc"])) == ["cba"]


@MODES
def test_context_length_and_engine_kwargs_come_from_vllm(recorder: Any, mode: str) -> None:
    engine = _engine(mode, max_model_len=96, gpu_memory_utilization=0.5, dtype="bfloat16")

    assert engine.context_length == 96
    if mode == "batch":
        assert recorder.llm_inits == [
            {"model": "fake/base", "max_model_len": 96, "gpu_memory_utilization": 0.5, "dtype": "bfloat16"}
        ]
    else:
        [args] = recorder.engine_args
        assert (args.model, args.max_model_len, args.gpu_memory_utilization, args.dtype) == (
            "fake/base",
            96,
            0.5,
            "bfloat16",
        )
        assert args.disable_log_stats is True


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="mode must be 'batch' or 'stream'"):
        VLLMEngine("m", mode="turbo")  # type: ignore[arg-type]


# -- batch mode --------------------------------------------------------------------------------


def test_batch_mode_generate_is_a_plain_function(fake_vllm: ModuleType) -> None:
    engine = VLLMEngine("fake/base")

    assert not inspect.iscoroutinefunction(engine.generate)


def test_batch_mode_sends_the_whole_batch_in_one_llm_call(recorder: Any) -> None:
    engine = _engine("batch")

    engine.generate(["a", "b", "c", "d"])
    engine.generate(["e"])

    assert [len(call.prompts) for call in recorder.generate_calls] == [4, 1]


def test_batch_mode_defaults_follow_vllm_limits(recorder: Any) -> None:
    engine = VLLMEngine("fake/base", max_num_seqs=8)
    assert engine.batcher_defaults() == {"max_batch_size": 8, "target_batch_tokens": 8 * 1024}

    engine.load()

    # The fake engine core reports 64 KV-cache blocks of 16 tokens.
    assert engine.batcher_defaults() == {"max_batch_size": 8, "target_batch_tokens": 64 * 16}


async def test_batch_mode_through_the_batcher(recorder: Any) -> None:
    engine = _engine("batch", max_num_seqs=4)
    prompts = [f"q{i}" for i in range(10)]

    async with engine.batcher(batch_timeout_s=0.01) as batcher:
        results = await batcher.run(prompts)

    assert [result.text for result in results] == [prompt[::-1] for prompt in prompts]
    assert all(len(call.prompts) <= 4 for call in recorder.generate_calls)
    assert sum(len(call.prompts) for call in recorder.generate_calls) == 10


# -- stream mode -------------------------------------------------------------------------------


def test_stream_mode_generate_is_a_coroutine_function(fake_vllm: ModuleType) -> None:
    engine = VLLMEngine("fake/base", mode="stream")

    assert inspect.iscoroutinefunction(engine.generate)


async def test_stream_mode_submits_records_individually_and_concurrently(recorder: Any) -> None:
    recorder.step_s = 0.005
    engine = _engine("stream")
    prompts = [f"record {i}" for i in range(8)]

    results = await _generate(engine, prompts)

    assert _texts(results) == [prompt[::-1] for prompt in prompts]
    traces = recorder.requests
    assert len({trace.request_id for trace in traces}) == len(traces) == 8
    assert recorder.max_active_requests == 8
    # Every request started before any finished: they overlapped inside the engine.
    assert max(trace.started for trace in traces) < min(trace.finished for trace in traces)


async def test_stream_mode_request_failure_fails_only_its_record(recorder: Any) -> None:
    from vllm.exceptions import GenerationError

    recorder.fail_marker = "boom"
    engine = _engine("stream")

    results = await _generate(engine, ["abc", "boom", "de"])

    assert _texts(results) == ["cba", "GenerationError", "ed"]
    assert isinstance(results[1], GenerationError)
    assert (engine.stats.records, engine.stats.failed_records) == (2, 1)


async def test_stream_mode_request_ids_stay_unique_across_calls(recorder: Any) -> None:
    engine = _engine("stream")

    await asyncio.gather(*(_generate(engine, [f"p{i}"]) for i in range(5)))

    assert len({trace.request_id for trace in recorder.requests}) == 5


def test_stream_mode_refuses_a_second_event_loop(recorder: Any) -> None:
    engine = _engine("stream")
    assert _texts(asyncio.run(_generate(engine, ["abc"]))) == ["cba"]

    with pytest.raises(RuntimeError, match="bound to the event loop"):
        asyncio.run(_generate(engine, ["abc"]))

    engine.close()
    engine.load()
    assert _texts(asyncio.run(_generate(engine, ["abc"]))) == ["cba"]


def test_stream_mode_defaults_stream_single_records(recorder: Any) -> None:
    engine = _engine("stream")

    assert engine.batcher_defaults() == {
        "max_batch_size": 1,
        "batch_timeout_s": 0.0,
        "max_concurrent_batches": 1024,
        "max_inflight_tokens": 2 * 64 * 16,
    }


async def test_stream_batcher_bounds_tokens_in_flight(recorder: Any) -> None:
    recorder.step_s = 0.002
    engine = _engine("stream", generation=GenerationConfig(max_new_tokens=16))
    prompts = [f"question number {i:02d}" for i in range(12)]  # 19 prompt tokens + 16 = 35 each
    assert {engine.estimate_tokens(prompt) for prompt in prompts} == {35}

    async with engine.batcher(max_inflight_tokens=100) as batcher:
        results = await batcher.run(prompts)

    assert [result.text for result in results] == [prompt[::-1][:16] for prompt in prompts]
    assert recorder.max_active_tokens <= 100
    assert recorder.max_active_requests == 2  # 2 * 35 fits in 100, 3 * 35 does not


async def test_stream_batcher_defaults_run_everything_concurrently(recorder: Any) -> None:
    recorder.step_s = 0.002
    engine = _engine("stream")
    prompts = [f"p{i:02d}" for i in range(40)]

    async with engine.batcher() as batcher:
        results = await batcher.run(prompts)

    assert [result.text for result in results] == [prompt[::-1] for prompt in prompts]
    assert recorder.max_active_requests > 20
    assert recorder.max_active_tokens <= engine.batcher_defaults()["max_inflight_tokens"]


# -- without vLLM ------------------------------------------------------------------------------


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import vllm` fail, as it does where vLLM is not installed."""
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "vllm", None)


def test_the_package_imports_without_vllm() -> None:
    # A fresh interpreter, so that re-imported modules cannot leak into other tests.
    script = (
        "import sys; sys.modules['vllm'] = None\n"
        "import flyteplugins_batcher, flyteplugins_batcher.engines\n"
        "from flyteplugins_batcher.engines._vllm import VLLMEngine\n"
        "print(VLLMEngine('some/model', mode='stream').mode)\n"
    )

    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "stream"


@pytest.mark.usefixtures("no_vllm")
@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_load_without_vllm_names_the_extra_to_install(mode: str) -> None:
    engine = VLLMEngine("some/model", mode=mode)  # type: ignore[arg-type]

    with pytest.raises(ImportError, match=r"pip install 'flyteplugins-batcher\[vllm\]'"):
        engine.load()
    assert not engine.is_loaded
