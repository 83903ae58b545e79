"""The replica's engine settings for the simulated engine, and the in-flight sizing fixed at import."""

from __future__ import annotations

import json

import pytest

from flyteplugins_batcher.engines import EngineConfigError
from flyteplugins_batcher.engines.simulated import SimulatedEngine
from flyteplugins_batcher.jobs._environments import vllm_default_max_num_seqs
from flyteplugins_batcher.replica import EngineSettings
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
