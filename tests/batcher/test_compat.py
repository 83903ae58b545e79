"""Drop-in compatibility with flyte.extras: same names, keywords, defaults and semantics.

Every test here runs against both implementations (the `impl` fixture) and must pass on both.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass

import pytest
from flyte.extras import _dynamic_batcher as flyte_module

import flyteplugins_batcher as ours

PUBLIC_NAMES = [name for name in flyte_module.__all__]


def test_every_public_name_of_flyte_extras_batcher_exists():
    missing = [name for name in PUBLIC_NAMES if not hasattr(ours, name)]
    assert missing == []
    assert set(PUBLIC_NAMES) <= set(ours.__all__)


@pytest.mark.parametrize("cls_name", ["DynamicBatcher", "TokenBatcher"])
def test_constructor_keywords_and_defaults_match(cls_name: str):
    theirs = inspect.signature(getattr(flyte_module, cls_name).__init__).parameters
    mine = inspect.signature(getattr(ours, cls_name).__init__).parameters
    for name, parameter in theirs.items():
        assert name in mine, f"{cls_name} lacks keyword {name!r}"
        assert mine[name].default == parameter.default, f"{cls_name}.{name} default differs"
        assert mine[name].kind == parameter.kind, f"{cls_name}.{name} kind differs"


@pytest.mark.parametrize("method", ["start", "stop", "submit", "submit_batch", "__aenter__", "__aexit__"])
def test_methods_exist(method: str):
    for cls in (ours.DynamicBatcher, ours.TokenBatcher):
        assert callable(getattr(cls, method))
    assert isinstance(inspect.getattr_static(ours.DynamicBatcher, "stats"), property)
    assert isinstance(inspect.getattr_static(ours.DynamicBatcher, "is_running"), property)


@pytest.mark.parametrize("method", ["submit", "submit_batch"])
def test_token_batcher_takes_the_dynamic_batchers_keywords_and_estimated_tokens(method: str):
    dynamic = list(inspect.signature(getattr(ours.DynamicBatcher, method)).parameters)
    token = list(inspect.signature(getattr(ours.TokenBatcher, method)).parameters)
    cost = dynamic.index("estimated_cost")
    assert token == [*dynamic[:cost], "estimated_tokens", *dynamic[cost:]]


def test_batch_stats_fields_and_utilization():
    theirs = flyte_module.BatchStats(busy_time_s=3.0, idle_time_s=1.0)
    mine = ours.BatchStats(busy_time_s=3.0, idle_time_s=1.0)
    for field_name in theirs.__dataclass_fields__:
        assert hasattr(mine, field_name)
    assert mine.utilization == theirs.utilization == 0.75


def test_prompt_estimates_four_chars_per_token(impl):
    assert impl.Prompt(text="abcdefgh").estimate_tokens() == 3
    assert isinstance(impl.Prompt(text="x"), impl.TokenEstimator)


async def echo_upper(batch: list[str]) -> list[str]:
    return [item.upper() for item in batch]


async def test_results_come_back_in_input_order(impl):
    async with impl.DynamicBatcher(process_fn=echo_upper, max_batch_size=4) as batcher:
        futures = await batcher.submit_batch([f"r{i}" for i in range(10)])
        assert await asyncio.gather(*futures) == [f"R{i}" for i in range(10)]
        assert batcher.is_running
    assert not batcher.is_running


async def test_submit_before_start_raises_runtime_error(impl):
    batcher = impl.DynamicBatcher(process_fn=echo_upper)
    with pytest.raises(RuntimeError):
        await batcher.submit("x")


async def test_double_start_raises(impl):
    batcher = impl.DynamicBatcher(process_fn=echo_upper)
    await batcher.start()
    try:
        with pytest.raises(RuntimeError):
            await batcher.start()
    finally:
        await batcher.stop()


async def test_length_mismatch_raises_value_error_into_every_future(impl):
    async def drops_one(batch: list[int]) -> list[int]:
        return batch[:-1]

    async with impl.DynamicBatcher(process_fn=drops_one, batch_timeout_s=0.05) as batcher:
        futures = await batcher.submit_batch([1, 2, 3])
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(outcome, ValueError) for outcome in outcomes)
    assert "2 results for batch of 3" in str(outcomes[0])


async def test_process_exception_reaches_every_affected_future(impl):
    class ModelDown(Exception):
        pass

    async def broken(batch: list[int]) -> list[int]:
        raise ModelDown("gpu fell off the bus")

    async with impl.DynamicBatcher(process_fn=broken) as batcher:
        futures = await batcher.submit_batch([1, 2, 3])
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert [type(outcome) for outcome in outcomes] == [ModelDown] * 3


@dataclass
class Priced:
    value: int

    def estimate_cost(self) -> int:
        return 7


@dataclass
class Tokened(Priced):
    def estimate_tokens(self) -> int:
        return 11


async def test_cost_precedence_explicit_then_fn_then_protocol_then_default(impl):
    seen_costs: list[int] = []

    async def record_cost(batch: list[object]) -> list[int]:
        return [0] * len(batch)

    def estimator(record: object) -> int:
        return 5

    async def batch_cost_of(batcher, record, **kwargs) -> int:
        before = batcher.stats.total_batch_cost
        await (await batcher.submit(record, **kwargs))
        seen_costs.append(batcher.stats.total_batch_cost - before)
        return seen_costs[-1]

    async with impl.DynamicBatcher(process_fn=record_cost, cost_estimator=estimator, default_cost=2) as batcher:
        assert await batch_cost_of(batcher, Priced(1), estimated_cost=3) == 3
        assert await batch_cost_of(batcher, Priced(1)) == 5
    async with impl.DynamicBatcher(process_fn=record_cost, default_cost=2) as batcher:
        assert await batch_cost_of(batcher, Priced(1)) == 7
        assert await batch_cost_of(batcher, "plain") == 2
    async with impl.TokenBatcher(inference_fn=record_cost, default_token_estimate=4) as batcher:
        assert await batch_cost_of(batcher, Tokened(1)) == 11
        assert await batch_cost_of(batcher, Priced(1)) == 7
        assert await batch_cost_of(batcher, "plain") == 4
        assert await batch_cost_of(batcher, Tokened(1), estimated_tokens=9) == 9


async def test_token_batcher_maps_token_keywords(impl):
    async with impl.TokenBatcher(process_fn=echo_upper, target_batch_tokens=123, default_token_estimate=9) as batcher:
        # Submitted together, they would share one batch under the default budget of 32 000; each
        # fills the budget of 123 tokens, so each goes alone.
        futures = await batcher.submit_batch(["a", "b", "c", "d"], estimated_cost=[123] * 4)
        assert await asyncio.gather(*futures) == ["A", "B", "C", "D"]
        assert batcher.stats.total_batches == 4
        assert await (await batcher.submit("plain")) == "PLAIN"
    assert batcher.stats.total_batch_cost == 4 * 123 + 9  # the last one costs the default token estimate
    with pytest.raises(TypeError):
        impl.TokenBatcher()


async def test_stats_count_records_and_batches(impl):
    async with impl.DynamicBatcher(process_fn=echo_upper, max_batch_size=5) as batcher:
        futures = await batcher.submit_batch([f"r{i}" for i in range(12)])
        await asyncio.gather(*futures)
    stats = batcher.stats
    assert stats.total_submitted == 12
    assert stats.total_completed == 12
    assert stats.total_batches >= 3
    assert stats.avg_batch_size == pytest.approx(12 / stats.total_batches)
    assert 0.0 < stats.utilization <= 1.0


async def submits_accepted_while_the_device_is_stuck(impl, queue: int, batch: int, prefetch: int) -> int:
    """How many submits return while the process function cannot finish (the next one awaits space)."""
    gate = asyncio.Event()

    async def gated(records: list[int]) -> list[int]:
        await gate.wait()
        return records

    accepted: list[asyncio.Future[int]] = []
    settings = {"max_queue_size": queue, "max_batch_size": batch, "prefetch_batches": prefetch}
    async with impl.DynamicBatcher(process_fn=gated, batch_timeout_s=0.01, **settings) as batcher:
        try:
            while len(accepted) < 100:
                try:
                    accepted.append(await asyncio.wait_for(batcher.submit(len(accepted)), 0.3))
                except asyncio.TimeoutError:
                    break
                await asyncio.sleep(0.03)  # records trickle in, as in flyte-sdk's own backpressure test
        finally:
            gate.set()
        assert await asyncio.gather(*accepted) == list(range(len(accepted)))
    return len(accepted)


@pytest.mark.parametrize(
    ("queue", "batch", "prefetch"), [(1, 1, 1), (2, 1, 1), (1, 1, 2), (3, 2, 1), (4, 4, 2)], ids=str
)
async def test_submit_blocks_no_earlier_than_flyte_extras(queue: int, batch: int, prefetch: int):
    """Backpressure: `submit` awaits only once the batcher holds what flyte.extras' would, and not much more.

    The bound: the batch in the process function, `prefetch_batches` staged batches, the batch being
    assembled and `max_queue_size` queued records. With one record per batch (flyte-sdk's own
    backpressure test) both accept exactly four submits; with larger batches flyte.extras sends
    trickling records one by one on its timeout, so it fills (and blocks) sooner than ours.
    """
    theirs = await submits_accepted_while_the_device_is_stuck(flyte_module, queue, batch, prefetch)
    mine = await submits_accepted_while_the_device_is_stuck(ours, queue, batch, prefetch)
    bound = batch * (1 + prefetch + 1) + queue
    assert theirs <= mine <= bound
    if batch == 1:
        assert mine == theirs == bound
