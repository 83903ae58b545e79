"""Cached prompt tokens on their way from an engine's completion to a run's outputs, summary and report (issue 40).

The simulated engine has no prefix cache, so the runs here wrap it (`HalfCached`): each answer says
half its prompt was found cached, as vLLM's `num_cached_tokens` says it. The real numbers on vLLM are
in `tests/engines/test_vllm_prefix_cache.py`.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pyarrow.parquet as pq
import pytest
from flyte.io import DataFrame, File
from flyte.types import TypeEngine

from flyteplugins_batcher.batch_api import BatchRequest
from flyteplugins_batcher.engines import Completion, GenerationConfig, Sample
from flyteplugins_batcher.jobs import RunSummary, run_batch_file, run_table
from flyteplugins_batcher.jobs._gsm8k.job import Tally, _rows
from flyteplugins_batcher.jobs._report import final_html
from flyteplugins_batcher.jobs._summary import Counts, summary_line
from flyteplugins_batcher.replica import (
    ChatMessage,
    ChunkOutcome,
    FinishedLine,
    ItemResult,
    LineRules,
    LLMReplica,
    ReplicaSnapshot,
    RequestChunk,
    RequestItem,
)
from flyteplugins_batcher.replica._llm import make_batcher
from tests.jobs.conftest import Replicas

SIMULATED = {"engine": "simulated", "engine_args": json.dumps({"time_scale": 50}), "max_new_tokens": 4}


class HalfCached:
    """A replica's batcher factory whose engine says it found half of each prompt in a prefix cache."""

    def make(self, engine: Any, settings: Any) -> Any:
        real = engine.generate

        def cached(outcomes: list[Any]) -> list[Any]:
            return [
                replace(outcome, cached_tokens=outcome.prompt_tokens // 2)
                if isinstance(outcome, Completion)
                else outcome
                for outcome in outcomes
            ]

        async def generate_async(records: list[Any]) -> list[Any]:
            return cached(await real(records))

        def generate(records: list[Any]) -> list[Any]:
            return cached(real(records))

        engine.generate = generate_async if inspect.iscoroutinefunction(real) else generate
        return make_batcher(engine, settings)


def chat(custom_id: str, text: str) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


# -- a result, a line ----------------------------------------------------------------------------------------------


async def test_cached_tokens_cross_the_task_boundary_and_outcomes_written_before_read_as_none_cached() -> None:
    one = Completion("hi", 10, 2, "stop", cached_tokens=6)
    several = Completion.from_samples(12, [Sample("a", 1, "stop"), Sample("b", 2, "length")], cached_tokens=8)
    results = [ItemResult.of("one", one), ItemResult.of("several", several)]
    outcome = ChunkOutcome(0, results, ReplicaSnapshot(replica="a"), finished_at=1.0)

    literal = await TypeEngine.to_literal(outcome, ChunkOutcome, TypeEngine.to_literal_type(ChunkOutcome))
    back = await TypeEngine.to_python_value(literal, ChunkOutcome)
    assert [result.completion() for result in back.results] == [one, several]

    written_before = msgpack.loads(literal.scalar.binary.value)  # an outcome Flyte cached before the field was kept
    for result in written_before["results"]:
        del result["cached_tokens"]
    literal.scalar.binary.value = msgpack.dumps(written_before)
    old = await TypeEngine.to_python_value(literal, ChunkOutcome)
    assert [result.completion() for result in old.results] == [
        replace(one, cached_tokens=0),
        replace(several, cached_tokens=0),
    ]


def test_a_lines_answer_carries_its_cached_tokens_to_its_usage_and_its_finished_line() -> None:
    rules = LineRules("m", "e", "error", GenerationConfig())
    request = rules.parse(json.dumps(chat("r1", "What is 2 + 2?")), 1)
    assert isinstance(request, BatchRequest)
    chunk = RequestChunk(0, [RequestItem.of(request)])
    answer = ItemResult.of("r1", Completion("4", 30, 1, "stop", cached_tokens=16))

    [finished] = rules.answers(chunk, ChunkOutcome(0, [answer], ReplicaSnapshot(), 1.0), "", {"r1": request})

    assert finished is not None and (finished.input_tokens, finished.output_tokens, finished.cached_tokens) == (
        30,
        1,
        16,
    )
    assert finished.output["response"]["body"]["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}


def test_a_finished_line_keeps_its_cached_tokens_in_the_journal_and_reads_journals_written_before() -> None:
    line = FinishedLine(4, True, {"custom_id": "r4"}, input_tokens=700, output_tokens=9, cached_tokens=640)
    assert json.loads(line.to_json())["tokens"] == [700, 9, 640]
    assert FinishedLine.from_json(line.to_json()) == line

    before = json.dumps({"line": 4, "ok": True, "output": {"custom_id": "r4"}, "tokens": [700, 9]})
    assert FinishedLine.from_json(before) == FinishedLine(4, True, {"custom_id": "r4"}, 700, 9, cached_tokens=0)
    untold = json.dumps({"line": 5, "ok": False, "output": {"error": "x"}})  # older still: no token counts
    assert FinishedLine.from_json(untold) == FinishedLine(5, False, {"error": "x"})


# -- a run's counts, summary and report ------------------------------------------------------------------------------


def test_a_run_counts_the_prompt_tokens_of_the_answers_it_computed_as_it_counts_generated_ones() -> None:
    counts = Counts()
    counts.count(failed=False, completion_tokens=5, prompt_tokens=700, cached_tokens=640)
    counts.count(failed=False, completion_tokens=7, prompt_tokens=700)
    counts.count(failed=False, completion_tokens=5, prompt_tokens=700, cached_tokens=640, fresh=False)  # reused
    counts.count(failed=True, completion_tokens=0)

    assert (counts.fresh_tokens, counts.fresh_prompt_tokens, counts.fresh_cached_tokens) == (12, 1400, 640)


def test_the_summary_line_and_the_report_give_prompt_tokens_the_cached_share_and_the_prefill_computed(
    tmp_path: Path,
) -> None:
    empty = File(path=str(tmp_path / "x.jsonl"))
    summary = RunSummary(
        "f",
        2,
        2,
        0,
        load_time_s=1.0,
        inference_s=2.0,
        requests_per_s=1.0,
        output_tokens_per_s=6.0,
        results=empty,
        errors=empty,
        prompt_tokens=1400,
        cached_tokens=640,
    )

    assert "| 1,400 prompt tokens, 46% cached, 760 computed | results:" in summary_line(summary, "requests")
    page = final_html(summary, [])
    for value, key in (
        ("1,400", "prompt tokens"),
        ("46%", "found in prefix cache"),
        ("760", "prefill tokens computed"),
    ):
        assert f'<div class="v">{value}</div><div class="k">{key}</div>' in page
    nothing = replace(summary, prompt_tokens=0, cached_tokens=0)  # every answer reused: nothing computed here
    assert "| 0 prompt tokens, 0% cached, 0 computed |" in summary_line(nothing, "requests")


def test_a_table_runs_summary_says_them_for_an_llm_and_not_for_embeddings() -> None:
    output = DataFrame.from_existing_remote("/tmp/table", format="parquet")
    llm = RunSummary(
        "t",
        4,
        4,
        0,
        load_time_s=1.0,
        inference_s=2.0,
        requests_per_s=2.0,
        output_tokens_per_s=8.0,
        output=output,
        prompt_tokens=400,
        cached_tokens=100,
    )
    embedded = replace(llm, dimensions=384)

    assert "| 400 prompt tokens, 25% cached, 300 computed | output:" in summary_line(llm)
    assert '<div class="v">25%</div><div class="k">found in prefix cache</div>' in final_html(llm, [])
    assert "prompt tokens" not in summary_line(embedded)
    assert "prefix cache" not in final_html(embedded, [])


def test_a_gsm8k_row_keeps_its_prompt_and_cached_tokens_and_the_tally_counts_them() -> None:
    chunk = RequestChunk(0, [RequestItem("3", messages=[ChatMessage("user", "What is 2 + 2?")])])
    answer = ItemResult.of("3", Completion("4", 20, 1, "stop", cached_tokens=16))
    [row] = _rows(chunk, ChunkOutcome(0, [answer], ReplicaSnapshot(), 1.0), "")
    tally = Tally()

    tally.add({**row, "gold": None}, fresh=True, retried=False)

    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (20, 16, 1)
    assert (tally.fresh_prompt_tokens, tally.fresh_cached_tokens, tally.fresh_tokens) == (20, 16, 1)


# -- whole runs on the simulated engine ------------------------------------------------------------------------------


def test_a_batch_files_results_summary_and_printed_line_count_the_engines_cached_tokens(
    run_locally: Any, replicas: Replicas, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replicas.use(LLMReplica(HalfCached().make))
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(chat(f"r{n}", f"Question {n}: " + "why? " * n)) + "\n" for n in range(5)))

    summary: RunSummary = run_locally(run_batch_file, input=File.from_local_sync(str(path)), chunk_size=2, **SIMULATED)

    usages = [
        json.loads(line)["response"]["body"]["usage"] for line in Path(summary.results.path).read_text().splitlines()
    ]
    assert len(usages) == 5 and summary.answered == 5
    assert [usage["prompt_tokens_details"]["cached_tokens"] for usage in usages] == [
        usage["prompt_tokens"] // 2 for usage in usages
    ]
    assert summary.prompt_tokens == sum(usage["prompt_tokens"] for usage in usages) > 0
    assert summary.cached_tokens == sum(usage["prompt_tokens"] // 2 for usage in usages) > 0
    share = summary.cached_tokens / summary.prompt_tokens
    computed = summary.prompt_tokens - summary.cached_tokens
    assert (
        f"{summary.prompt_tokens:,} prompt tokens, {share:.0%} cached, {computed:,} computed" in capsys.readouterr().out
    )


def test_a_table_runs_summary_counts_the_engines_cached_tokens(
    run_locally: Any, replicas: Replicas, tmp_path: Path
) -> None:
    replicas.use(LLMReplica(HalfCached().make))
    table = tmp_path / "questions.jsonl"
    table.write_text("".join(json.dumps({"question": f"What is {n} + {n}?"}) + "\n" for n in range(6)))

    summary: RunSummary = run_locally(
        run_table, input=str(table), prompt="{question}", output_dir=str(tmp_path / "out"), **SIMULATED
    )

    input_tokens = pq.read_table(str(tmp_path / "out")).column("num_input_tokens").to_pylist()
    assert summary.answered == 6 and summary.prompt_tokens == sum(input_tokens) > 0
    assert summary.cached_tokens == sum(tokens // 2 for tokens in input_tokens)
