"""The run's summary as `flyte run` prints it: the fields the run measured and that apply to it, nothing else."""

from __future__ import annotations

from flyte.io import File

from flyteplugins_batcher.jobs import RunSummary


def test_a_generation_run_on_transformers_shows_no_occupancy_and_no_embedding_fields() -> None:
    summary = RunSummary(
        source="the bundled sample",
        requests=32,
        answered=31,
        failed=1,
        load_time_s=4.9997,
        inference_s=61.25,
        requests_per_s=0.50612,
        output_tokens_per_s=58.4,
        occupancy=None,  # Transformers has no continuous batching to be full of
        prompt_tokens=2760,
        results=File(path="/tmp/run/answers.jsonl"),
        errors=File(path="/tmp/run/failed.jsonl"),
        accuracy=0.125,
        scored=31,
    )
    shown = repr(summary)
    assert shown == (
        "RunSummary(source='the bundled sample', requests=32, answered=31, failed=1, reused=0, retried=0, "
        "load_time_s=5.000, inference_s=61.25, requests_per_s=0.5061, output_tokens_per_s=58.40, prompt_tokens=2760, "
        "cached_tokens=0, results='/tmp/run/answers.jsonl', errors='/tmp/run/failed.jsonl', accuracy=0.1250, "
        "scored=31)"
    )
    for absent in ("occupancy", "None", "dimensions", "padding_efficiency", "avg_batch_size", "models", "output="):
        assert absent not in shown


def test_an_embeddings_run_shows_its_own_fields_and_no_accuracy() -> None:
    summary = RunSummary(
        source="corpus", requests=4, answered=4, failed=0, dimensions=384, truncated=1, avg_batch_size=4.0
    )
    shown = repr(summary)
    assert "dimensions=384, truncated=1, padding_efficiency=0.000, avg_batch_size=4.000" in shown
    assert "accuracy" not in shown and "scored" not in shown and "occupancy" not in shown


def test_a_measured_occupancy_and_an_unmeasured_inference_time_say_so() -> None:
    summary = RunSummary(source="s", requests=8, answered=8, failed=0, inference_s=None, occupancy=0.8125)
    shown = repr(summary)
    assert "occupancy=0.8125" in shown and "inference_s" not in shown
