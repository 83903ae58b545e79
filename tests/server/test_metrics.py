"""What `/metrics` says of the engine, read from its statistics when scraped (`server/_metrics.py`)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from flyteplugins_batcher.engines import EngineStats
from flyteplugins_batcher.server._metrics import ServerMetrics


def test_the_prompt_tokens_found_in_the_prefix_cache_are_a_counter_beside_the_prompt_tokens() -> None:
    stats = EngineStats(prompt_tokens=1400, cached_tokens=640, completion_tokens=12)
    metrics = ServerMetrics(batchers={}, engine=lambda: stats)

    families = {family.name: family for family in text_string_to_metric_families(metrics.render().decode())}

    counters = {
        name: families[name] for name in ("batcher_engine_prompt_tokens", "batcher_engine_prompt_tokens_cached")
    }
    assert {name: family.type for name, family in counters.items()} == dict.fromkeys(counters, "counter")
    assert [(sample.name, sample.value) for sample in counters["batcher_engine_prompt_tokens_cached"].samples] == [
        ("batcher_engine_prompt_tokens_cached_total", 640.0)
    ]
    assert counters["batcher_engine_prompt_tokens"].samples[0].value == 1400.0
