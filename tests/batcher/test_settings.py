"""BatcherSettings: one validated value behind every way of building a batcher."""

from __future__ import annotations

import dataclasses

import pytest

import flyteplugins_batcher as ours


def test_defaults_are_flyte_extras_defaults_plus_ours():
    settings = ours.BatcherSettings()
    assert (settings.target_batch_cost, settings.max_batch_size, settings.batch_timeout_s) == (32_000, 256, 0.05)
    assert (settings.max_queue_size, settings.prefetch_batches, settings.grouping) == (5_000, 2, "fifo")
    assert settings.inflight_cost_limit == 32_000
    assert settings.queue_capacity == 5_000 + 256  # the queue plus the batch being assembled


def test_token_names_map_onto_cost_names():
    settings = ours.BatcherSettings.from_keywords(target_batch_tokens=512, max_inflight_tokens=2048)
    assert settings.target_batch_cost == 512 and settings.max_inflight_cost == 2048
    with pytest.raises(TypeError, match="given twice"):
        ours.BatcherSettings.from_keywords(target_batch_tokens=1, target_batch_cost=2)


def test_a_misspelt_setting_fails_with_a_suggestion():
    with pytest.raises(TypeError, match="'max_batchsize' is not a batcher setting; did you mean 'max_batch_size'"):
        ours.BatcherSettings().replace(max_batchsize=8)


def test_settings_are_frozen_and_validated_on_replace():
    settings = ours.BatcherSettings(max_batch_size=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_batch_size = 9  # type: ignore[misc]
    with pytest.raises(ValueError, match="min_batch_size must be between 1 and max_batch_size"):
        settings.replace(min_batch_size=9)
    assert settings.replace(min_batch_size=8).min_batch_size == 8


def test_options_split_estimator_name_and_settings():
    def count(record: str) -> int:
        return len(record)

    options = ours.BatcherOptions.parse({"token_estimator": count, "name": "llm", "target_batch_tokens": 99})
    assert options.cost_estimator is count and options.name == "llm"
    assert options.settings.target_batch_cost == 99
    with pytest.raises(TypeError, match="not both"):
        ours.BatcherOptions.parse({"token_estimator": count, "cost_estimator": count})


async def test_a_batcher_built_from_settings_behaves_like_one_built_from_keywords():
    async def double(batch: list[int]) -> list[int]:
        return [value * 2 for value in batch]

    settings = ours.BatcherSettings(max_batch_size=3)
    batcher = ours.TokenBatcher.from_settings(double, settings, name="from-settings")
    assert batcher.settings is settings and batcher.name == "from-settings"
    assert await batcher.run(range(7)) == [value * 2 for value in range(7)]
    assert batcher.stats.batch_size.max <= 3
