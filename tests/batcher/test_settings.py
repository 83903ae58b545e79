"""BatcherSettings: one validated value behind every way of building a batcher."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

import flyteplugins_batcher as ours


def test_defaults_are_flyte_extras_defaults_plus_ours():
    settings = ours.BatcherSettings()
    assert (settings.target_batch_cost, settings.max_batch_size, settings.batch_timeout_s) == (32_000, 256, 0.05)
    assert (settings.max_queue_size, settings.prefetch_batches, settings.grouping) == (5_000, 2, "fifo")
    assert settings.in_flight_cost_limit == 32_000
    assert settings.queue_capacity == 5_000 + 256  # the queue plus the batch being assembled


def test_token_names_map_onto_cost_names():
    settings = ours.BatcherSettings.from_keywords(target_batch_tokens=512, max_in_flight_tokens=2048)
    assert settings.target_batch_cost == 512 and settings.max_in_flight_cost == 2048
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


def test_batched_options_differ_from_the_batchers_only_where_documented():
    default = ours.BatcherOptions.for_batched({"max_batch_size": 64}).settings
    assert default == ours.BatcherSettings(
        max_batch_size=64, grouping="by_cost", default_cost="length", target_batch_cost=None
    )
    assert default.batch_budget > 10**18 and default.in_flight_cost_limit == default.batch_budget
    with_estimator = ours.BatcherOptions.for_batched({"cost_estimator": len}).settings
    assert with_estimator == ours.BatcherSettings(grouping="by_cost")  # the estimator's costs meet the 32,000 budget
    token_costs = ours.BatcherOptions.for_batched({}, length_costs=False).settings
    assert token_costs == ours.BatcherSettings(grouping="by_cost")
    given = ours.BatcherOptions.for_batched({"grouping": "fifo", "target_batch_tokens": 500, "default_cost": 3})
    assert (given.settings.grouping, given.settings.target_batch_cost, given.settings.default_cost) == ("fifo", 500, 3)


@pytest.mark.parametrize("bad", [{"default_cost": "chars"}, {"default_cost": -1}, {"target_batch_cost": 0}])
def test_length_and_budget_settings_are_validated(bad: dict):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ours.BatcherSettings(**bad)


async def test_a_dynamic_batcher_can_cost_by_length_with_no_budget():
    import numpy as np

    seen: list[list[object]] = []

    def log(batch: list[object]) -> list[object]:
        seen.append(batch)
        return batch

    records = ["abc", b"de", (1, 2, 3, 4), {"key": "value", "other": 1}, np.array(2.5), np.arange(5)]
    async with ours.DynamicBatcher(log, default_cost="length", target_batch_cost=None) as batcher:
        for record in records:  # one at a time: each batch's cost is its record's
            await (await batcher.submit(record))
        costs = [batcher.stats.batch_cost.min, batcher.stats.batch_cost.max, batcher.stats.total_batch_cost]
    # 1 (a word) + 2 + 4 + 1 (a mapping) + 1 (a 0-d array has no length) + 5
    assert costs == [1, 5, 14] and len(seen) == len(records)


async def test_a_batcher_built_from_settings_behaves_like_one_built_from_keywords():
    async def double(batch: list[int]) -> list[int]:
        return [value * 2 for value in batch]

    settings = ours.BatcherSettings(max_batch_size=3)
    batcher = ours.TokenBatcher.from_settings(double, settings, name="from-settings")
    assert batcher.settings is settings and batcher.name == "from-settings"
    assert await batcher.run(range(7)) == [value * 2 for value in range(7)]
    assert batcher.stats.batch_size.max <= 3


def test_the_batchers_keywords_are_the_settings_fields_with_their_defaults():
    fields = {field.name: field.default for field in dataclasses.fields(ours.BatcherSettings)}
    for batcher_class in (ours.DynamicBatcher, ours.TokenBatcher):
        parameters = inspect.signature(batcher_class).parameters
        assert {name: parameters[name].default for name in fields} == fields
        assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in fields)
    token_parameters = inspect.signature(ours.TokenBatcher).parameters
    for token_name in ("target_batch_tokens", "default_token_estimate", "max_in_flight_tokens"):
        assert token_parameters[token_name].default is None  # None: the cost-named keyword decides
    assert "target_batch_tokens" not in inspect.signature(ours.DynamicBatcher).parameters


def test_the_keyword_types_for_type_checkers_are_the_settings_field_types():
    field_types = typing.get_type_hints(ours.BatcherSettings)
    for batcher_class, extra in (
        (ours.DynamicBatcher, set()),
        (ours.TokenBatcher, {"target_batch_tokens", "default_token_estimate", "max_in_flight_tokens"}),
    ):
        unpacked = typing.get_type_hints(batcher_class.__init__)["settings"]
        (keywords,) = typing.get_args(unpacked)  # Unpack[TheTypedDict]
        keyword_types = typing.get_type_hints(keywords)
        deprecated = {"max_inflight_cost", "max_inflight_tokens"} & set(keyword_types)
        assert set(keyword_types) - deprecated == set(field_types) | extra
        assert {name: keyword_types[name] for name in field_types} == field_types


@pytest.mark.parametrize("batcher_class", [ours.DynamicBatcher, ours.TokenBatcher])
def test_a_misspelt_batcher_keyword_fails_where_it_is_written(batcher_class: type):
    with pytest.raises(TypeError, match="'max_batchsize' is not a batcher setting; did you mean 'max_batch_size'"):
        batcher_class(lambda batch: batch, max_batchsize=8)
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        batcher_class(lambda batch: batch, max_batch_size=0)


def test_token_batcher_lets_a_given_token_name_win_as_flyte_extras_does():
    batcher = ours.TokenBatcher(lambda batch: batch, target_batch_tokens=100, target_batch_cost=500)
    assert batcher.settings.target_batch_cost == 100
    batcher = ours.TokenBatcher(lambda batch: batch, target_batch_tokens=None, target_batch_cost=500)
    assert batcher.settings.target_batch_cost == 500
    with pytest.raises(TypeError, match="given twice"):  # our own settings API asks for one name
        ours.BatcherSettings.from_keywords(target_batch_tokens=100, target_batch_cost=500)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # how they warn: the test below
def test_settings_spelt_the_0_1_0_way_still_work():
    old_style = [
        ours.BatcherSettings(max_inflight_cost=7),
        ours.BatcherSettings().replace(max_inflight_cost=7),
        ours.DynamicBatcher(lambda batch: batch, max_inflight_cost=7).settings,
        ours.TokenBatcher(lambda batch: batch, max_inflight_tokens=7).settings,
    ]
    assert all(settings.max_in_flight_cost == 7 for settings in old_style)
    assert old_style[0].max_inflight_cost == 7 and old_style[0].inflight_cost_limit == 7
    with pytest.raises(TypeError, match="given twice"):
        ours.BatcherSettings(max_inflight_cost=7, max_in_flight_cost=8)


def test_each_deprecated_spelling_warns_once_per_process_at_the_callers_line():
    script = textwrap.dedent(
        """
        import warnings
        import flyteplugins_batcher as ours

        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            for _ in range(2):
                settings = ours.BatcherSettings(max_inflight_cost=7)
                settings.max_inflight_cost, settings.inflight_cost_limit
                ours.TokenBatcher(lambda batch: batch, max_inflight_tokens=7)
                ours.BatchStats().inflight_batches
        for warning in caught:
            print(warning.category.__name__, warning.filename.endswith("<string>"), warning.message)
        """
    )
    repository = Path(__file__).resolve().parents[2]
    printed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=repository
    ).stdout
    lines = printed.splitlines()
    assert all(line.startswith("DeprecationWarning True ") for line in lines), printed
    old_names = ["max_inflight_cost", "inflight_cost_limit", "max_inflight_tokens", "inflight_batches"]
    assert sorted(line.split("'")[1] for line in lines) == sorted(old_names)
