"""The replica's engine settings for the simulated engine, the in-flight sizing fixed at import, and a stopped
chunk's lines stopped in the engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from flyteplugins_batcher.engines import EngineConfigError
from flyteplugins_batcher.engines.simulated import SimulatedEngine
from flyteplugins_batcher.jobs._environments import vllm_default_max_num_seqs
from flyteplugins_batcher.replica import ChatMessage, EngineSettings, LLMReplica, RequestChunk, RequestItem
from flyteplugins_batcher.replica._llm import engine_kwargs, load_engine


def test_the_simulated_engine_takes_its_options_from_engine_args() -> None:
    options = {"time_scale": 50, "gpu": {"max_num_seqs": 64}, "output_lengths": {"mean": 30, "long_fraction": 0.05}}
    settings = EngineSettings(engine="simulated", model="sim-8b", engine_args=json.dumps(options), max_new_tokens=99)

    engine = load_engine(settings)
    try:
        assert isinstance(engine, SimulatedEngine) and engine.model_name == "sim-8b"
        assert (engine.time_scale, engine.gpu.max_num_seqs, engine.gpu.max_num_batched_tokens) == (50, 64, 8192)
        assert (engine.output_lengths.mean, engine.output_lengths.long_fraction) == (30, 0.05)
        assert engine.generation.max_new_tokens == 99
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (EngineSettings(engine="simulated", max_model_len=512), "max_model_len do not apply to engine='simulated'"),
        (EngineSettings(engine="simulated", dtype="float32"), "dtype do not apply"),
        (EngineSettings(engine="simulated", engine_args='{"bogus": 1}'), "unexpected keyword argument 'bogus'"),
        (EngineSettings(engine="simulated", engine_args='{"gpu": {"max_num_seqs": 0}}'), "max_num_seqs must be"),
    ],
)
def test_settings_the_simulated_engine_cannot_take_fail_without_retries(settings: EngineSettings, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        load_engine(settings)


def test_only_named_options_reach_it() -> None:
    assert engine_kwargs(EngineSettings(engine="simulated")) == {}


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("H100:1", 1024), ("h200:8", 1024), ("B200", 1024), ("A100:1", 256), ("L4:1", 256), (None, 256)],
)
def test_the_sizing_assumes_vllms_default_max_num_seqs_for_the_gpu(gpu: str | None, expected: int) -> None:
    assert vllm_default_max_num_seqs(gpu) == expected


LINES, LONG = 8, 1000
LONG_ANSWERS = EngineSettings(
    engine="simulated",
    engine_args=json.dumps({"time_scale": 2, "gpu": {"max_num_seqs": LINES}, "output_lengths": {"mean": LONG}}),
    max_new_tokens=LONG,
)
"""Eight lines whose answers run to 1,000 tokens: about 4 s of the simulated GPU when nothing stops them."""


@contextlib.asynccontextmanager
async def admit_at_once() -> AsyncIterator[None]:
    """Admits a line at once (as a server's online target does with no online request in sight)."""
    yield


async def _steps_settled(engine: SimulatedEngine) -> int:
    """The engine's steps once it has stopped stepping (two reads 0.2 s apart agree)."""
    while True:
        steps = engine.stats.steps
        await asyncio.sleep(0.2)
        if engine.stats.steps == steps:
            return steps


@pytest.mark.parametrize("admitted", [False, True], ids=["no-admission", "admitted"])
@pytest.mark.parametrize("how", ["stop", "task-cancelled"])
async def test_a_stopped_chunk_stops_its_running_lines_in_the_engine(admitted: bool, how: str) -> None:
    """A chunk stopped by its `stop` event (a server's cancelled batch) or cancelled as a task (a Flyte task
    cancelled on a reusable replica) stops its lines in the engine, whether they waited to be admitted (a server's
    online target) or not: the engine makes a small part of their answers, not all of them."""
    replica = LLMReplica(admit=admit_at_once if admitted else None)
    items = [RequestItem(f"r{n}", messages=[ChatMessage("user", f"Write story number {n}.")]) for n in range(LINES)]
    stop = asyncio.Event() if how == "stop" else None  # `infer_chunk` passes none
    try:
        running = asyncio.create_task(replica.run_chunk(RequestChunk(0, items), LONG_ANSWERS, stop=stop))
        while (engine := replica.shared.loaded_model) is None or engine.stats.steps < 20:
            await asyncio.sleep(0.01)
        assert isinstance(engine, SimulatedEngine)
        if stop is not None:
            stop.set()
            outcome = await running
            assert [result.was_stopped for result in outcome.results] == [True] * LINES
        else:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        steps = await _steps_settled(engine)
        assert steps < LONG / 4, f"the engine made {steps} steps of {LONG}: the stopped lines ran on"
        assert engine.stats.completion_tokens < LINES * LONG / 4
    finally:
        await replica.aclose()
