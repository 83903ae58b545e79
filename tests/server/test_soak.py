"""A short soak (`benchmarks/soak.py`): mixed traffic against one server on the simulated engine loses nothing.

About 75 s of traffic from 8 clients (15 s of it warm-up), then the soak's own checks: every batch
ended with its counts adding up and each custom_id once in its files, no temporary file left and
every file of the size its row says, no 5xx and no traceback in the server's log, the same answer
to the same request whole or streamed, and the server's RSS at the end within 10% of its RSS after
the warm-up. `make soak MINUTES=10` runs a longer one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import SoakOptions, kinds, run_soak, summary

pytestmark = pytest.mark.slow


def test_a_short_soak_loses_nothing(tmp_path: Path) -> None:
    result = run_soak(SoakOptions(minutes=1.25, seed=7, folder=tmp_path))
    # Whichever check fails says it with every table, the problems and where the server's log is.
    report = f"{summary(result)}\n\nserver log: {result.log}"

    assert result.problems == [], report
    assert {kind for kind, _ in result.tally.outcomes} >= set(kinds(with_embeddings=True)), report  # every kind sent
    assert result.tally.outcomes["stream abandoned", "left after the first events"] > 0, report
    assert result.tally.outcomes["wait abandoned", "left while waiting (client timeout)"] > 0, report
    assert result.batch_statuses["completed"] > 0 and result.batch_statuses["cancelled"] > 0, report
    assert sum(result.batch_statuses.values()) == len(result.tally.batches), report
    assert not [status for status in result.tally.statuses if status >= 500], report
    assert result.warm is not None and result.end is not None, report
    assert abs(result.end.rss_kib / result.warm.rss_kib - 1) <= 0.10, report
