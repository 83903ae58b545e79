"""Failures stay where they belong: per record, per submit, per batch; the batcher never dies silently."""

from __future__ import annotations

import asyncio
import logging

import pytest

import flyteplugins_batcher as ours
from tests.batcher.conftest import fixed_in_ours, run_isolated


def notes(exc: BaseException) -> str:
    return " ".join(getattr(exc, "__notes__", []))


async def test_an_exception_in_a_result_slot_fails_only_that_record():
    async def parse(batch: list[str]) -> list[object]:
        return [int(item) if item.isdigit() else ValueError(f"not a number: {item!r}") for item in batch]

    async with ours.DynamicBatcher(parse) as batcher:
        futures = await batcher.submit_batch(["1", "x", "3"])
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert outcomes[0] == 1 and outcomes[2] == 3
    assert isinstance(outcomes[1], ValueError)
    assert "record #2 'x'" in notes(outcomes[1])
    assert batcher.stats.total_failed == 1


class PoisonError(Exception):
    pass


class PoisonAware:
    """Fails the whole batch if any record is poison, like a model that chokes on one input."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, batch: list[str]) -> list[str]:
        self.calls.append(list(batch))
        poison = [item for item in batch if item.startswith("poison")]
        if poison:
            raise PoisonError(f"cannot digest {poison[0]}")
        return [item.upper() for item in batch]


async def test_split_isolates_the_failing_records_and_the_rest_succeed():
    fn = PoisonAware()
    records = [f"ok{i}" for i in range(16)]
    records[5] = "poison-a"
    records[12] = "poison-b"
    async with ours.DynamicBatcher(fn, on_error="split", batch_timeout_s=0.05) as batcher:
        futures = await batcher.submit_batch(records)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    for record, outcome in zip(records, outcomes, strict=True):
        if record.startswith("poison"):
            assert isinstance(outcome, PoisonError)
            assert record in notes(outcome)
        else:
            assert outcome == record.upper()
    assert len(fn.calls) <= 1 + 2 * 2 * 4  # about 2*log2(16) extra calls per failing record


async def test_default_raise_mode_fails_the_whole_batch_and_says_how_to_isolate():
    async with ours.DynamicBatcher(PoisonAware(), batch_timeout_s=0.05) as batcher:
        futures = await batcher.submit_batch(["fine", "poison"])
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(outcome, PoisonError) for outcome in outcomes)
    assert "on_error='split'" in notes(outcomes[0])


async def test_estimator_error_fails_only_that_submit():
    def estimator(record: str) -> int:
        if record == "bad":
            raise KeyError("no tokenizer entry")
        return 1

    async with ours.DynamicBatcher(PoisonAware(), cost_estimator=estimator) as batcher:
        with pytest.raises(KeyError) as raised:
            await batcher.submit("bad")
        assert "'bad'" in notes(raised.value)
        assert await (await batcher.submit("good")) == "GOOD"


async def test_invalid_cost_is_rejected_with_the_record_named():
    async with ours.DynamicBatcher(PoisonAware(), cost_estimator=lambda record: -3) as batcher:
        with pytest.raises(ValueError, match="gave -3 for 'neg'"):
            await batcher.submit("neg")


@fixed_in_ours("a CancelledError escaping the process function kills its processing loop; later records hang")
def test_cancelled_error_from_the_process_fn_fails_that_batch_only(impl):
    calls = 0

    async def flaky(batch: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise asyncio.CancelledError()
        return batch

    async def scenario() -> tuple[bool, list[int]]:
        async with impl.DynamicBatcher(process_fn=flaky) as batcher:
            first = await batcher.submit(1)
            try:
                await first
                first_failed = False
            except BaseException:
                first_failed = True
            second = await batcher.submit(2)
            return first_failed, [await second]

    first_failed, later = run_isolated(scenario, 2.0)
    assert first_failed and later == [2]


class Fatal(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


async def test_a_fatal_base_exception_fails_every_pending_future_and_later_submits():
    release = asyncio.Event()

    async def dies(batch: list[int]) -> list[int]:
        await release.wait()
        raise Fatal("segfault in the driver")

    batcher = ours.DynamicBatcher(dies, max_batch_size=2)
    await batcher.start()
    futures = [await batcher.submit(i) for i in range(5)]  # 2 in flight, 3 queued
    release.set()
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(outcome, ours.BatcherFailedError) for outcome in outcomes)
    assert isinstance(outcomes[0].__cause__, Fatal)
    with pytest.raises(ours.BatcherFailedError):
        await batcher.submit(99)
    await asyncio.wait_for(batcher.stop(), timeout=1.0)


@pytest.mark.parametrize("fatal", [ours.UnrecoverableError("the engine process died"), Fatal("a bug")])
async def test_an_unrecoverable_error_is_logged_as_one_line_and_a_bug_with_its_traceback(
    fatal: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    async def dies(batch: list[int]) -> list[int]:
        raise fatal

    caplog.set_level(logging.INFO, logger="flyteplugins_batcher")
    batcher = ours.DynamicBatcher(dies, max_batch_size=2)
    await batcher.start()
    futures = [await batcher.submit(i) for i in range(5)]
    await asyncio.gather(*futures, return_exceptions=True)
    await asyncio.wait_for(batcher.stop(), timeout=1.0)

    reports = [record for record in caplog.records if record.levelno >= logging.WARNING]
    if isinstance(fatal, ours.UnrecoverableError):  # raised on purpose: its message is the one report
        assert [(record.levelno, record.exc_info) for record in reports] == [(logging.WARNING, None)]
        assert "failed: the engine process died; failing all pending records" in reports[0].getMessage()
    else:
        assert reports[0].levelno == logging.ERROR and reports[0].exc_info is not None


def test_keyboard_interrupt_in_the_process_fn_propagates_and_fails_pending_futures():
    seen: list[BaseException] = []

    async def interrupted(batch: list[int]) -> list[int]:
        raise KeyboardInterrupt

    async def scenario() -> None:
        batcher = ours.DynamicBatcher(interrupted)
        await batcher.start()
        future = await batcher.submit(1)
        future.add_done_callback(lambda f: seen.append(f.exception()))
        await asyncio.sleep(1.0)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(scenario())
    assert len(seen) == 1 and isinstance(seen[0], ours.BatcherFailedError)


async def test_a_cancelled_record_never_reaches_the_process_fn():
    seen: list[int] = []
    release = asyncio.Event()

    async def gated(batch: list[int]) -> list[int]:
        seen.extend(batch)
        await release.wait()
        return batch

    async with ours.DynamicBatcher(gated, max_batch_size=1) as batcher:
        first = await batcher.submit(1)
        second = await batcher.submit(2)
        third = await batcher.submit(3)
        second.cancel()
        release.set()
        assert await first == 1 and await third == 3
    assert seen == [1, 3]
    assert batcher.stats.total_cancelled == 1


async def test_sync_process_fn_exceptions_reach_the_futures():
    def broken(batch: list[int]) -> list[int]:
        raise RuntimeError("sync failure")

    async with ours.DynamicBatcher(broken) as batcher:
        future = await batcher.submit(1)
        with pytest.raises(RuntimeError, match="sync failure"):
            await future


async def test_a_non_list_result_is_a_clear_error():
    async def returns_none(batch: list[int]) -> None:
        return None

    async with ours.DynamicBatcher(returns_none) as batcher:
        with pytest.raises(ours.ResultCountError, match="must return a list"):
            await (await batcher.submit(1))
