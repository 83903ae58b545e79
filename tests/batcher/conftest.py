"""Fixtures for the batcher tests: the batcher classes under test, ours and flyte.extras'."""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from flyte import extras

import flyteplugins_batcher as ours

T = TypeVar("T")

IMPLEMENTATIONS = {"ours": ours, "flyte": extras}


@pytest.fixture(params=list(IMPLEMENTATIONS))
def impl(request: pytest.FixtureRequest) -> types.ModuleType:
    """The module whose DynamicBatcher/TokenBatcher is under test, for behaviour both must share."""
    return IMPLEMENTATIONS[request.param]


def fixed_in_ours(defect: str) -> pytest.MarkDecorator:
    """Runs a test against ours and flyte.extras; the flyte.extras run must fail (strict xfail).

    This keeps every "fixes a defect" test honest: it demonstrably fails on the old behaviour.
    """
    return pytest.mark.parametrize(
        "impl",
        [
            pytest.param(ours, id="ours"),
            pytest.param(extras, id="flyte", marks=pytest.mark.xfail(strict=True, reason=f"flyte.extras: {defect}")),
        ],
    )


def run_isolated(main: Callable[[], Awaitable[T]], seconds: float) -> T:
    """Run `main()` on a fresh event loop in a daemon thread, with a deadline that cannot hang.

    A deadlocked batcher never unwinds (flyte.extras' stop() blocks forever on a full queue), so
    neither `asyncio.wait_for` nor the test loop's teardown could get past it; a daemon thread
    can simply be abandoned.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="isolated-batcher-test")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"did not finish within {seconds}s (deadlock or hang)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
