"""The final report as a user sees it: rendered by a real headless Chromium, from real batchers' snapshots.

A script in the page measures what the browser laid out (every chart's marks and size, every SVG
label against its chart's box, every table cell against its content) and writes the result into
the DOM, which `chromium --dump-dom` prints. CI installs Chromium (`make browser`); without it the
test is skipped.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flyte.io import File

import flyteplugins_batcher as ours
from flyteplugins_batcher.jobs import RunSummary
from flyteplugins_batcher.jobs._report import final_html
from flyteplugins_batcher.jobs._report_charts import (
    busy_runs,
    busy_shares,
    chart_series,
    mean_batch_sizes,
    rates,
    run_axis,
)
from flyteplugins_batcher.replica import ReplicaSnapshot

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,2000",
)
NO_NVML = "not available: nvidia-ml-py is not installed (it comes with the GPU image)"
ROUNDS = 4
"""Rounds of work per replica, each followed by an idle pause: the strip must show each as its own busy stretch."""

MEASURE = """
<script>
(function () {
  const slack = 0.5;
  const result = { charts: {}, overflowingText: [], overflowingCells: [], pageOverflow: 0 };
  // what a label shows: its own text, not its tooltip (<title>)
  const shown = (text) => [...text.childNodes].filter((node) => node.nodeType === 3).map((node) => node.data).join("");
  const count = (svg, selector) => [...svg.querySelectorAll(selector)].filter((mark) => {
    const box = mark.getBoundingClientRect();
    return box.width > 0 && box.height > 0;
  }).length;
  for (const svg of document.querySelectorAll("svg")) {
    const box = svg.getBoundingClientRect();
    const style = getComputedStyle(svg);
    const name = svg.dataset.chart || "unnamed";
    result.charts[name] = {
      width: box.width, height: box.height,
      visible: style.display !== "none" && style.visibility === "visible",
      busy: count(svg, "rect.busy"), idle: count(svg, "rect.idle"), dots: count(svg, "circle.size"),
      bars: count(svg, "rect.rate"), utilization: svg.querySelectorAll("rect.utilization").length,
      texts: [...svg.querySelectorAll("text")].map(shown),
    };
    for (const text of svg.querySelectorAll("text")) {
      const own = text.getBoundingClientRect();
      if (own.left < box.left - slack || own.right > box.right + slack ||
          own.top < box.top - slack || own.bottom > box.bottom + slack) {
        result.overflowingText.push({ chart: name, text: shown(text), left: own.left, right: own.right,
                                      chartLeft: box.left, chartRight: box.right });
      }
    }
  }
  for (const cell of document.querySelectorAll("td, th")) {
    if (cell.scrollWidth > cell.clientWidth) result.overflowingCells.push(cell.textContent);
  }
  result.pageOverflow = document.documentElement.scrollWidth - document.documentElement.clientWidth;
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
})();
</script>
"""

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (`make browser` installs it)"
)


@dataclass
class Generated:
    """A fake model's answer, counting its tokens as the engines' `Completion` does."""

    completion_tokens: int


def fake_model(batch: list[int]) -> list[Generated]:
    time.sleep(0.002 * len(batch))  # the device, busy in proportion to the batch
    return [Generated(10 + record % 7) for record in batch]


async def replica_snapshot(name: str, rounds: int) -> ReplicaSnapshot:
    """A replica's snapshot after `rounds` of work, each followed by a pause (the CPU loading the next data)."""
    async with ours.TokenBatcher(fake_model, max_batch_size=8, batch_timeout_s=0.01) as batcher:
        for n in range(rounds):
            await batcher.run(range(5 + 7 * n))
            await asyncio.sleep(0.1)
    return ReplicaSnapshot.of_batcher(batcher.stats, replica=name, model="fake", device_note=NO_NVML)


async def report(tmp_path: Path, names: list[str]) -> tuple[Path, list[ReplicaSnapshot], float]:
    """The final report of replicas that ran at the same time, written with the measuring script.

    Returns:
        The page, the replicas' snapshots, and the run's wall time the report drew them over.
    """
    started = time.time()
    replicas = list(await asyncio.gather(*(replica_snapshot(name, ROUNDS - n) for n, name in enumerate(names))))
    wall_s = time.time() - started
    nowhere = File(path=str(tmp_path / "results.jsonl"))
    result = RunSummary(
        "sample",
        100,
        99,
        1,
        inference_s=wall_s,
        requests_per_s=50.0,
        output_tokens_per_s=500.0,
        results=nowhere,
        errors=nowhere,
    )
    page = tmp_path / "report.html"
    page.write_text(f"<!doctype html><html><body>{final_html(result, replicas)}{MEASURE}</body></html>")
    return page, replicas, wall_s


def measured(page: Path, profile: Path) -> dict[str, Any]:
    """What the page's script measured, as Chromium laid it out."""
    run = subprocess.run(
        [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="measured">(.*?)</pre>', run.stdout, re.DOTALL)
    assert found, f"chromium printed no measurement (exit {run.returncode}): {run.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def expected_marks(replicas: list[ReplicaSnapshot], wall_s: float) -> dict[str, int]:
    """How many marks each chart must hold, worked out from the same snapshots."""
    axis = run_axis(replicas, wall_s)
    assert axis is not None
    series = chart_series(replicas)
    return {
        "busy": sum(len(busy_runs(busy_shares(one, axis))) for one in series),
        "dots": sum(size is not None for one in series for size in mean_batch_sizes(one, axis)),
        "bars": sum(rate > 0 for one in series for rate in rates(one, axis, tokens=True)),
    }


@pytest.mark.parametrize(
    "names", [["pod-a/101"], ["pod-a/101", "batch-llm-gpu-a-very-long-kubernetes-pod-name-xk2v9-0/20202"]]
)
async def test_the_report_draws_the_replicas_timelines_and_every_label_fits(tmp_path: Path, names: list[str]) -> None:
    page, replicas, wall_s = await report(tmp_path, names)

    seen = measured(page, tmp_path / "profile")

    assert seen["overflowingText"] == []
    assert seen["overflowingCells"] == []
    assert seen["pageOverflow"] <= 0
    charts = seen["charts"]
    assert set(charts) == {"utilization", "device", "batch-size", "throughput"}
    for name, chart in charts.items():
        assert chart["visible"] and chart["width"] > 0 and chart["height"] > 0, name
    expected = expected_marks(replicas, wall_s)
    assert charts["device"]["busy"] == expected["busy"]
    assert charts["batch-size"]["dots"] == expected["dots"]
    assert charts["throughput"]["bars"] == expected["bars"]
    rounds = sum(ROUNDS - n for n in range(len(names)))
    # every round of work is its own busy stretch between idle ones, with its own batches
    assert charts["device"]["busy"] >= rounds and charts["device"]["idle"] == len(names)
    assert charts["batch-size"]["dots"] >= rounds and charts["throughput"]["bars"] >= 2
    assert charts["utilization"]["utilization"] == len(names)
    assert sum("GPU n/a" in label for label in charts["utilization"]["texts"]) == len(names)
    assert sum(label.startswith("busy: a batch") for label in charts["device"]["texts"]) == 1
    for name in names:  # each replica in the legend, its name whole or cut with an ellipsis
        assert any(name.startswith(label.rstrip("…")) for label in charts["batch-size"]["texts"]), name
