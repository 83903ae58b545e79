"""What `/metrics` exports, in Prometheus' text format, with `prometheus-client`.

Named the way Prometheus users expect (base units, `_total` counters, `_seconds` histograms) and
anchored on the names they know: Ray Serve's `serve_batch_*` for the batcher, vLLM's `vllm:*` for
the engine. Every batcher metric carries a `batcher` label (`llm`, `embeddings`).

| metric | type | anchor |
|---|---|---|
| `batcher_queue_length` | gauge | Ray Serve `serve_batch_queue_length` |
| `batcher_batch_size` | histogram | Ray Serve `serve_actual_batch_size` |
| `batcher_batch_cost` | histogram | (tokens, for the LLM) |
| `batcher_batch_wait_seconds` | histogram | Ray Serve `serve_batch_wait_time_ms`, vLLM `request_queue_time_seconds` |
| `batcher_request_latency_seconds` | histogram | vLLM `e2e_request_latency_seconds` |
| `batcher_batches_total{reason}` | counter | Ray Serve `serve_batches_processed_total` |
| `batcher_records_total{outcome}` | counter | processed (went through the model), cancelled, expired |
| `batcher_record_errors_total` | counter | records whose result was an error |
| `batcher_device_busy_seconds_total` | counter | busy time measured where the model runs |
| `batcher_engine_steps_total`, `batcher_engine_running_sequences_total` | counters | vLLM `iteration_tokens_total` |
| `batcher_engine_max_num_seqs`, `batcher_engine_occupancy_ratio` | gauges | vLLM `num_requests_running` |
| `batcher_engine_prompt_tokens_total`, `batcher_engine_generation_tokens_total` | counters | vLLM's, same names |
| `batcher_engine_prompt_tokens_cached_total` | counter | vLLM's, same name: prompt tokens found in the prefix cache |
| `batcher_http_requests_total{endpoint,outcome}` | counter | |
| `batcher_http_request_duration_seconds{endpoint}` | histogram | |
| `batcher_batch_jobs{status}` | gauge | Batch API jobs by status |
| `batcher_online_time_to_first_token_seconds` | histogram | vLLM `time_to_first_token_seconds` |
| `batcher_online_time_per_output_token_seconds` | histogram | vLLM `time_per_output_token_seconds` |
| `batcher_online_slo_batch_quota` (absent: any) | gauge | with an online target: the lines it lets run |
| `batcher_online_slo_batch_lines_in_flight`, `_waiting` | gauges | lines running, and waiting for a place |
| `batcher_online_slo_overloaded` | gauge | online requests alone miss the target |
| `batcher_online_slo_arrivals_per_second`, `_sustainable_per_second` | gauges | online load, and what meets it |
| `batcher_online_slo_refused_total` | counter | online requests answered 429 for the target |

The online histograms time streamed requests, and with an online target every one.

Occupancy over a window is `rate(batcher_engine_running_sequences_total[1m]) /
rate(batcher_engine_steps_total[1m]) / batcher_engine_max_num_seqs`; the gauge is since the engine
started.
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flyteplugins_batcher import BatchStats, DispatchReason, SettledOutcome
from flyteplugins_batcher.engines import EngineStats
from flyteplugins_batcher.server._admission import OnlineAdmissionStats, OnlineTimes

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
COST_BUCKETS = tuple(2**power for power in range(4, 22, 2))  # 16 to 1M


DRAIN_WINDOW_S = 30.0
"""How far back the drain rate looks: recent enough to follow a change of load, long enough to be steady."""


class DrainRate:
    """Records that left a batcher per second over the last `window_s`: how fast its queue drains now.

    Kept as one count per second (at most `window_s` of them), so adding is O(1) at any rate.

    Args:
        window_s: How far back it looks.
        clock: Seconds, monotonic.
    """

    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._since = clock()
        self._seconds: deque[list[int]] = deque()  # [second, records]

    def add(self, records: int) -> None:
        second = math.floor(self._clock())
        if self._seconds and self._seconds[-1][0] == second:
            self._seconds[-1][1] += records
        else:
            self._seconds.append([second, records])
        self._forget(second)

    def per_s(self) -> float:
        """Records per second over the window (or the time since it started, when shorter); 0 when none left."""
        now = self._clock()
        self._forget(math.floor(now))
        span = min(self.window_s, now - self._since)
        return sum(records for _, records in self._seconds) / span if span > 0 else 0.0

    def _forget(self, second: int) -> None:
        while self._seconds and self._seconds[0][0] <= second - self.window_s:
            self._seconds.popleft()


class BatcherHistograms:
    """A `BatchObserver` that feeds the batcher histograms of one batcher (its `batcher` label), and its drain rate."""

    def __init__(self, metrics: ServerMetrics, name: str) -> None:
        self._size = metrics.batch_size.labels(name)
        self._cost = metrics.batch_cost.labels(name)
        self._wait = metrics.batch_wait.labels(name)
        self._latency = metrics.latency.labels(name)
        self.drain = metrics.drain.setdefault(name, DrainRate())

    def on_dispatch(self, size: int, cost: int, reason: DispatchReason, queue_waits_s: Sequence[float]) -> None:
        self._size.observe(size)
        self._cost.observe(cost)
        for wait in queue_waits_s:
            self._wait.observe(wait)

    def on_settled(self, outcome: SettledOutcome, latencies_s: Sequence[float], failed: int) -> None:
        self.drain.add(len(latencies_s))
        if outcome == "completed":
            for latency in latencies_s:
                self._latency.observe(latency)


class ServerMetrics:
    """The server's registry: histograms fed as things happen, and the rest read from the stats when scraped.

    Args:
        batchers: `{label: stats}` of the batchers to read at scrape time (each returns `None` before it starts).
        engine: The LLM engine's stats, or `None` before it loads.
        batch_jobs: The Batch API jobs' statuses.
        online_admission: The online target's figures, or `None` without a target.

    Example:
        ```python
        metrics = ServerMetrics(batchers={"llm": lambda: batcher.stats}, engine=lambda: engine.stats)
        batcher.add_observer(metrics.observer("llm"))
        body = metrics.render()
        ```
    """

    def __init__(
        self,
        *,
        batchers: dict[str, Callable[[], BatchStats | None]],
        engine: Callable[[], EngineStats | None],
        batch_jobs: Callable[[], Sequence[str]] = tuple,
        online_admission: Callable[[], OnlineAdmissionStats | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry()
        histogram = functools.partial(_histogram, self.registry, labels=["batcher"])
        self.batch_size = histogram("batcher_batch_size", "Records per batch", buckets=SIZE_BUCKETS)
        self.batch_cost = histogram(
            "batcher_batch_cost",
            "Estimated cost per batch, in the batcher's unit (tokens for the LLM)",
            buckets=COST_BUCKETS,
        )
        self.batch_wait = histogram(
            "batcher_batch_wait_seconds", "Time a record waited from submit to its batch's dispatch"
        )
        self.latency = histogram("batcher_request_latency_seconds", "Time from submit to a record's result")
        self.http_requests = Counter(
            "batcher_http_requests",
            "HTTP requests by endpoint and outcome",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.http_duration = _histogram(
            self.registry, "batcher_http_request_duration_seconds", "HTTP request handling time", labels=["endpoint"]
        )
        self.online_ttfb, self.online_ttft, self.online_tpot = _online_metrics(self.registry, online_admission)
        self.registry.register(_StatsCollector(batchers, engine, batch_jobs))
        self.drain = {name: DrainRate() for name in batchers}  # fed by the observers: a 429's Retry-After

    def observer(self, batcher: str) -> BatcherHistograms:
        """The observer to add to the batcher labelled `batcher`."""
        return BatcherHistograms(self, batcher)

    def online_first_byte(self, seconds: float) -> None:
        """One streamed online request's time to first byte: from its arrival to its response's headers."""
        self.online_ttfb.observe(seconds)

    def online_times(self, times: OnlineTimes) -> None:
        """One online request's time to first token and per output token."""
        self.online_ttft.observe(times.ttft_s)
        if times.tpot_s is not None:
            self.online_tpot.observe(times.tpot_s)

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one HTTP request by its outcome (`ok`, `client_error`, `rate_limited`, `server_error`)."""
        self.http_requests.labels(endpoint, _outcome(status)).inc()
        self.http_duration.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)


def _online_metrics(
    registry: CollectorRegistry, online_admission: Callable[[], OnlineAdmissionStats | None]
) -> tuple[Histogram, Histogram, Histogram]:
    """Streamed online requests' time to first byte; online requests' time to first token, and per output token
    after it (vLLM's two figures of a stream); the online target's gauges, read at scrape time."""
    registry.register(_OnlineAdmissionCollector(online_admission))
    first_byte = _histogram(
        registry,
        "batcher_online_time_to_first_byte_seconds",
        "Time from a streamed online request's arrival to its response's headers",
    )
    first = _histogram(
        registry,
        "batcher_online_time_to_first_token_seconds",
        "Time from an online request's arrival to its first token",
    )
    per_token = _histogram(
        registry,
        "batcher_online_time_per_output_token_seconds",
        "Time per output token of an online request, after its first",
    )
    return first_byte, first, per_token


def _histogram(
    registry: CollectorRegistry,
    name: str,
    documentation: str,
    *,
    labels: Sequence[str] = (),
    buckets: Sequence[float] = SECONDS_BUCKETS,
) -> Histogram:
    return Histogram(name, documentation, list(labels), registry=registry, buckets=buckets)


def _outcome(status: int) -> str:
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "server_error"
    return "client_error" if status >= 400 else "ok"


class _StatsCollector(Collector):
    """The gauges and counters that the batchers' and the engine's own statistics hold, read at scrape time."""

    def __init__(
        self,
        batchers: dict[str, Callable[[], BatchStats | None]],
        engine: Callable[[], EngineStats | None],
        batch_jobs: Callable[[], Sequence[str]],
    ) -> None:
        self._batchers = batchers
        self._engine = engine
        self._batch_jobs = batch_jobs

    def collect(self) -> Iterator[Metric]:
        yield from self._batcher_metrics()
        engine = self._engine()
        if engine is not None:
            yield from _engine_metrics(engine)
        jobs = GaugeMetricFamily("batcher_batch_jobs", "Batch API jobs by status", labels=["status"])
        for status, count in sorted(Tally(self._batch_jobs()).items()):
            jobs.add_metric([status], count)
        yield jobs

    def _batcher_metrics(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily("batcher_queue_length", "Records waiting for a batch", labels=["batcher"])
        batches = CounterMetricFamily("batcher_batches", "Batches dispatched, by reason", labels=["batcher", "reason"])
        records = CounterMetricFamily(
            "batcher_records",
            "Records that left the batcher: processed, cancelled or expired",
            labels=["batcher", "outcome"],
        )
        errors = CounterMetricFamily("batcher_record_errors", "Records whose result was an error", labels=["batcher"])
        busy = CounterMetricFamily(
            "batcher_device_busy_seconds",
            "Seconds with a batch inside the model, timed where it runs",
            labels=["batcher"],
        )
        for name, read in self._batchers.items():
            stats = read()
            if stats is None:
                continue
            queue.add_metric([name], stats.queue_depth)
            for reason, count in stats.batches_by_reason.items():
                batches.add_metric([name, reason], count)
            for outcome, count in (
                ("processed", stats.total_completed),
                ("cancelled", stats.total_cancelled),
                ("expired", stats.total_expired),
            ):
                records.add_metric([name, outcome], count)
            errors.add_metric([name], stats.total_failed)
            busy.add_metric([name], stats.busy_time_s)
        yield from (queue, batches, records, errors, busy)


def _engine_metrics(stats: EngineStats) -> Iterator[Metric]:
    counters: dict[str, tuple[str, Any]] = {
        "batcher_engine_steps": ("Engine steps (scheduler iterations)", stats.steps),
        "batcher_engine_running_sequences": (
            "Sequences running in each step, summed over the steps",
            stats.running_seqs,
        ),
        "batcher_engine_prompt_tokens": ("Prompt tokens read", stats.prompt_tokens),
        "batcher_engine_prompt_tokens_cached": ("Prompt tokens found in the prefix cache", stats.cached_tokens),
        "batcher_engine_generation_tokens": ("Tokens generated", stats.completion_tokens),
    }
    for name, (documentation, value) in counters.items():
        yield CounterMetricFamily(name, documentation, value=value)
    if stats.max_num_seqs:
        yield GaugeMetricFamily(
            "batcher_engine_max_num_seqs", "Sequences the engine runs at once", value=stats.max_num_seqs
        )
        occupancy = stats.occupancy or 0.0
        yield GaugeMetricFamily(
            "batcher_engine_occupancy_ratio",
            "Running sequences per step over max_num_seqs, since load",
            value=occupancy,
        )


class _OnlineAdmissionCollector(Collector):
    """The online target's quota for batch lines, and whether online requests alone are too many (read at scrape)."""

    def __init__(self, read: Callable[[], OnlineAdmissionStats | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        if stats is None:
            return
        gauges: dict[str, tuple[str, float | None]] = {
            "batcher_online_slo_batch_quota": ("Batch lines the online target lets run (absent: any)", stats.quota),
            "batcher_online_slo_batch_lines_in_flight": ("Batch lines queued or running", stats.batch_in_flight),
            "batcher_online_slo_batch_lines_waiting": ("Batch lines waiting for a place", stats.batch_waiting),
            "batcher_online_slo_overloaded": ("1 while online requests alone miss the target", float(stats.overloaded)),
            "batcher_online_slo_arrivals_per_second": ("Online requests arriving lately", stats.arrivals_per_s),
            "batcher_online_slo_sustainable_per_second": (
                "Online requests per second that met the target lately",
                stats.sustainable_per_s,
            ),
        }
        for name, (documentation, value) in gauges.items():
            if value is not None:
                yield GaugeMetricFamily(name, documentation, value=value)
        yield CounterMetricFamily(
            "batcher_online_slo_refused", "Online requests answered 429 for the target", value=stats.refused
        )
