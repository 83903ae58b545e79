"""Several base models in one batch file (issue 35): declared, named, routed, fanned out model by model, time-sharing
the replicas (each loads a model once and closes it before the next), and accounted for per model.

The simulated engine stands in for the models here (any name is a model to it); `test_several_models_vllm.py` runs
two real checkpoints on vLLM.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flyte.errors
import pytest
from flyte.io import File

from flyteplugins_batcher.batch_api import BatchRequest, RequestLineError
from flyteplugins_batcher.engines import EngineConfigError, GenerationConfig
from flyteplugins_batcher.jobs import RunSummary, fan_out, run_batch_file
from flyteplugins_batcher.jobs._driver import FanOutStats
from flyteplugins_batcher.jobs._jsonl.spool import Spool
from flyteplugins_batcher.jobs._report import final_html
from flyteplugins_batcher.replica import (
    ChunkCutter,
    EngineSettings,
    LineRules,
    LLMReplica,
    ReplicaSnapshot,
    RequestChunk,
    RequestItem,
)
from flyteplugins_batcher.replica._llm import load_engine
from tests.jobs.conftest import EngineLog, Replicas

TWO = "sim-a\nsim-b"
ADAPTERS = json.dumps(
    [
        {"name": "a-sql", "path": "/adapters/a-sql"},  # no base named, none readable: the first model's
        {"name": "b-chat", "path": "/adapters/b-chat", "base_model_name": "sim-b"},
    ]
)


def chat(custom_id: str, model: str | None = None, text: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": f"{custom_id}: {text}"}], "max_tokens": 4}
    if model is not None:
        body["model"] = model
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


# -- declaring models --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("declared", ["sim-a\nsim-b", "sim-a, sim-b", " sim-a ,\n\nsim-b\n"])
def test_several_models_are_declared_one_a_line_or_separated_by_commas(declared: str) -> None:
    assert EngineSettings(model=declared).base_models() == ["sim-a", "sim-b"]
    assert EngineSettings().base_models() == [""] and EngineSettings(model="org/m").base_models() == ["org/m"]


def test_each_model_answers_to_its_names_and_owns_the_adapters_that_name_it(tmp_path: Path) -> None:
    trained = tmp_path / "trained-on-b"
    trained.mkdir()
    (trained / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/b"}))
    lora = json.dumps(
        [
            {"name": "a-sql", "path": "/adapters/a-sql"},
            {"name": "b-chat", "path": "/adapters/b-chat", "base_model_name": "b"},
            {"name": "b-own", "path": str(trained)},
        ]
    )

    first, second = EngineSettings(model="org/a\n/models/b", lora_modules=lora).served_models("alias-a")

    assert (first.reference, first.name, first.aliases) == ("org/a", "alias-a", ("org/a",))
    assert (second.reference, second.name, second.aliases) == ("/models/b", "/models/b", ("b",))  # as given
    assert first.adapter_names == ("a-sql",)  # neither named nor readable: the first model's
    assert second.adapter_names == ("b-chat", "b-own")  # named by base_model_name; trained on b (its config)


def test_a_models_settings_carry_it_and_only_its_adapters_and_one_model_keeps_the_runs_settings() -> None:
    settings = EngineSettings(engine="simulated", model=TWO, lora_modules=ADAPTERS, max_new_tokens=9)
    first, second = settings.served_models()

    for_b = settings.for_model(second)
    assert (for_b.model, for_b.adapters(), for_b.max_new_tokens) == ("sim-b", {"b-chat": "/adapters/b-chat"}, 9)
    assert settings.for_model(first).adapters() == {"a-sql": "/adapters/a-sql"}
    alone = EngineSettings(model="sim-a", lora_modules="x=/x")
    assert alone.for_model(alone.served_models()[0]) is alone  # a run of one model: its cache keys stay as they were


@pytest.mark.parametrize(
    ("model", "lora", "message"),
    [
        ("sim-a\nsim-a", "", "model declares 'sim-a' twice"),
        ("/one/m\n/two/m", "", "two declared models answer to 'm'"),
        (TWO, "sim-b=/x", "two declared models answer to 'sim-b'"),
        (TWO, json.dumps([{"name": "x", "path": "/x", "base_model_name": "sim-c"}]), "none of the declared models"),
    ],
)
def test_models_that_cannot_be_told_apart_fail_naming_the_clash(model: str, lora: str, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        EngineSettings(model=model, lora_modules=lora).served_models()


def test_an_engine_loads_one_model_and_says_how_to_run_several() -> None:
    with pytest.raises(EngineConfigError, match=r"model names 2 base models \(sim-a, sim-b\) and an engine runs one"):
        load_engine(EngineSettings(engine="simulated", model=TWO))
    with pytest.raises(ValueError, match="models_per_replica must be >= 1"):
        EngineSettings(models_per_replica=0)


def test_the_server_serves_one_base_model_and_says_where_several_run() -> None:
    from flyteplugins_batcher.server import ServerSettings

    with pytest.raises(ValueError, match="the server serves one base model, and model names 2"):
        ServerSettings(engine=EngineSettings(model=TWO))


def test_the_command_line_takes_model_more_than_once_as_vllm_takes_lora_modules() -> None:
    from flyteplugins_batcher.cli._options import join_variadic

    joined = join_variadic(["--model", "org/a", "-o", "out", "--model=/models/b", "--lora-modules", "x=/x"])
    assert joined == ["-o", "out", "--model", "org/a\n/models/b", "--lora-modules", "x=/x"]


# -- a line's model ----------------------------------------------------------------------------------------------


def rules(settings: EngineSettings, mismatch: str = "error") -> LineRules:
    models = settings.served_models()
    adapters = tuple(name for model in models for name in model.adapter_names)
    return LineRules(models[0].name, "e", mismatch, GenerationConfig(), adapters=adapters, models=models)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "runs_on"),
    [("sim-a", "sim-a"), ("sim-b", "sim-b"), ("b-chat", "sim-b"), ("a-sql", "sim-a"), (None, "sim-a")],
)
def test_a_line_runs_on_the_model_it_names_or_whose_adapter_it_names(model: str | None, runs_on: str) -> None:
    line_rules = rules(EngineSettings(model=TWO, lora_modules=ADAPTERS))
    request = line_rules.parse(json.dumps(chat("q", model)), 1)

    assert isinstance(request, BatchRequest)
    served = line_rules.model_of(request)
    assert served is not None and served.reference == runs_on


def test_a_line_naming_no_declared_model_fails_alone_listing_them_unless_told_to_ignore() -> None:
    settings = EngineSettings(model=TWO, lora_modules=ADAPTERS)
    with pytest.raises(RequestLineError, match=r"body.model 'gpt-4o' is not a served model \('sim-a', 'sim-b'\)"):
        rules(settings).parse(json.dumps(chat("q", "gpt-4o")), 3)

    ignored = rules(settings, "ignore").parse(json.dumps(chat("q", "gpt-4o")), 3)
    assert isinstance(ignored, BatchRequest) and rules(settings, "ignore").model_of(ignored).reference == "sim-a"  # type: ignore[union-attr]


def test_a_chunk_holds_one_models_lines_numbered_across_models() -> None:
    line_rules = rules(EngineSettings(model=TWO))
    cutter = ChunkCutter(2, 8, order="file")
    full = []
    for number, model in enumerate(["sim-a", "sim-b", "sim-a", "sim-b", "sim-b"], start=1):
        request = line_rules.parse(json.dumps(chat(f"q{number}", model)), number)
        full += cutter.add(request, model)
    rest = cutter.rest()

    assert [(chunk.index, [item.key for item in chunk.items]) for chunk in full] == [
        (0, ["q1", "q3"]),
        (1, ["q2", "q4"]),
    ]
    assert [(chunk.index, [item.key for item in chunk.items]) for chunk in rest] == [(2, ["q5"])]


def test_a_spool_gives_each_lane_back_in_the_order_it_came_and_leaves_nothing(tmp_path: Path) -> None:
    line_rules = rules(EngineSettings(model=TWO))
    spool = Spool(tmp_path)
    requests = [line_rules.parse(json.dumps(chat(f"q{n}", "sim-b" if n % 2 else "sim-a")), n) for n in range(6)]
    for request in requests:
        spool.add(str(request.model), request)

    assert spool.lanes == ["sim-a", "sim-b"]
    assert list(spool.take("sim-b")) == requests[1::2] and spool.lanes == ["sim-a"]
    spool.close()
    assert list(tmp_path.iterdir()) == []


# -- the replica ---------------------------------------------------------------------------------------------------


def chunk_of(index: int, *keys: str) -> RequestChunk:
    return RequestChunk(index, [RequestItem(key, prompt=key) for key in keys])


def test_a_replica_closes_the_model_it_holds_before_it_loads_another_and_loads_each_once(replicas: Replicas) -> None:
    log = EngineLog()
    replica = replicas.use(LLMReplica(log.make))
    settings = EngineSettings(engine="simulated", model=TWO, max_new_tokens=4)
    first, second = (settings.for_model(model) for model in settings.served_models())

    async def scenario() -> None:
        for index, model in enumerate([first, first, second, second]):
            await replica.run_chunk(chunk_of(index, f"p{index}"), model)

    asyncio.run(scenario())

    assert replica.loads == {"sim-a": 1, "sim-b": 1}
    assert log.most_loaded == 1 and not log.engines[0].is_loaded  # sim-a closed before sim-b loaded
    assert [model for model, _ in log.answered] == ["sim-a", "sim-a", "sim-b", "sim-b"]


def test_a_replica_told_two_models_fit_holds_two_and_closes_the_least_recently_used_for_a_third(
    replicas: Replicas,
) -> None:
    log = EngineLog()
    replica = replicas.use(LLMReplica(log.make))
    settings = EngineSettings(engine="simulated", model="sim-a\nsim-b\nsim-c", models_per_replica=2)
    a, b, c = (settings.for_model(model) for model in settings.served_models())

    async def scenario() -> None:
        for index, model in enumerate([a, b, a, b, c]):
            await replica.run_chunk(chunk_of(index, f"p{index}"), model)

    asyncio.run(scenario())

    assert replica.loads == {"sim-a": 1, "sim-b": 1, "sim-c": 1} and log.most_loaded == 2
    loaded = {engine.model_name: engine.is_loaded for engine in log.engines}
    assert loaded == {"sim-a": False, "sim-b": True, "sim-c": True}  # a was used least recently


# -- the fan-out -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    index: int
    phase: int | None


async def phased(phases: list[int | None]) -> AsyncIterator[Chunk]:
    for index, phase in enumerate(phases):
        yield Chunk(index, phase)


def test_a_chunk_of_a_new_phase_waits_until_every_chunk_in_flight_finished() -> None:
    running: list[Chunk] = []
    seen_together: list[set[int | None]] = []

    async def infer(chunk: Chunk) -> None:
        running.append(chunk)
        seen_together.append({other.phase for other in running if other.phase is not None})
        await asyncio.sleep(0.01 * (chunk.index % 3))
        running.remove(chunk)

    async def keep(chunk: Chunk, outcome: object, reason: str) -> None:
        pass

    phases = [0, None, 0, 0, 0, 1, None, 1, 1, 0]
    asyncio.run(fan_out(phased(phases), infer, keep, max_in_flight=4, phase=lambda chunk: chunk.phase))

    assert all(len(together) <= 1 for together in seen_together)  # never two phases on the replicas at once
    assert max(len(together) for together in seen_together) == 1


def test_a_runs_load_time_sums_its_phases_slowest_loads_and_a_swapping_replica_has_a_row_per_model() -> None:
    from flyteplugins_batcher.replica import ChunkOutcome

    stats = FanOutStats(started_at=100.0, wall_s=30.0)
    for phase, replica, model, loaded_at, load in [
        (0, "r1", "a", 105.0, 5.0),
        (0, "r2", "a", 107.0, 7.0),
        (1, "r1", "b", 115.0, 3.0),  # phase 1's load, once phase 0 has finished
        (None, "e", "m", 121.0, 1.0),  # the embeddings' replica loads whenever: here on its own
    ]:
        snapshot = ReplicaSnapshot(replica=replica, model=model, load_time_s=load, loaded_at=loaded_at, records=1)
        stats.record(ChunkOutcome(0, [], snapshot, finished_at=125.0), started=100.0, phase=phase)
    warm = ReplicaSnapshot(replica="w", model="a", load_time_s=60.0, loaded_at=90.0, records=9)
    stats.record(ChunkOutcome(1, [], warm, finished_at=125.0), started=100.0, phase=0)  # loaded before the run

    assert stats.load_time_s == 7.0 + 3.0 + 1.0 and stats.model_loads == {"a": 7.0, "b": 3.0, "m": 1.0}
    assert stats.inference_s == 30.0 - 11.0
    assert [replica.replica for replica in stats.replicas] == ["e", "r1 a", "r1 b", "r2", "w"]


# -- the job, through flyte's local runner -----------------------------------------------------------------------


def write(tmp_path: Path, lines: list[dict[str, Any]]) -> File:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return File.from_local_sync(str(path))


def results(summary: RunSummary) -> dict[str, dict[str, Any]]:
    lines = [json.loads(line) for line in Path(summary.results.path).read_text().splitlines()]
    return {line["custom_id"]: line["response"]["body"] for line in lines}


MIXED = [
    chat("b1", "sim-b"),  # the file names sim-b first: its lines run first, as the file is read
    chat("a1", "sim-a"),
    chat("b2", "b-chat"),
    chat("a2"),  # no model: the first declared
    chat("a3", "a-sql"),
    chat("b3", "sim-b"),
    chat("x", "gpt-4o"),  # fails alone
    chat("a4", "sim-a"),
]


def test_a_file_of_two_models_runs_them_one_after_the_other_each_loaded_once_per_replica(
    run_locally: Any, replicas: Replicas, tmp_path: Path
) -> None:
    log = EngineLog()
    replica = replicas.use(LLMReplica(log.make))

    summary: RunSummary = run_locally(
        run_batch_file,
        input=write(tmp_path, MIXED),
        output_dir=str(tmp_path / "out"),
        engine="simulated",
        model=TWO,
        lora_modules=ADAPTERS,
        chunk_size=2,
        max_failed_fraction=1.0,
    )

    assert replica.loads == {"sim-a": 1, "sim-b": 1} and log.most_loaded == 1
    models = [model for model, _ in log.answered]
    assert models == ["sim-b"] * 3 + ["sim-a"] * 4  # every sim-b prompt before any sim-a one
    answered = results(summary)
    assert {key: body["model"] for key, body in answered.items()} == {
        "b1": "sim-b", "b2": "b-chat", "b3": "sim-b", "a1": "sim-a", "a2": "sim-a", "a3": "a-sql", "a4": "sim-a"
    }  # fmt: skip
    error = json.loads((tmp_path / "out" / "errors.jsonl").read_text())["error"]
    assert error["code"] == "model_mismatch" and "('sim-a', 'sim-b')" in error["message"]
    assert [(part.model, part.requests, part.failed) for part in summary.models] == [("sim-b", 3, 0), ("sim-a", 4, 0)]
    assert all(0 < part.share <= 1 and part.wall_s > 0 for part in summary.models)
    assert sum(part.share for part in summary.models) <= 1.0
    assert (summary.requests, summary.answered, summary.failed) == (8, 7, 1)


def test_the_report_and_the_summary_lines_show_each_models_lines_load_and_share(
    run_locally: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary: RunSummary = run_locally(
        run_batch_file, input=write(tmp_path, MIXED[:6]), engine="simulated", model=TWO, lora_modules=ADAPTERS
    )

    printed = capsys.readouterr().out
    assert re.search(r"model sim-b: 3 requests \| model load \d+\.\d s \| \d+\.\d s, \d+% of the run", printed)
    assert re.search(r"model sim-a: 3 requests \| model load", printed)
    page = final_html(summary, [])
    assert "<h3>Models</h3>" in page and "<td>sim-b</td><td>3</td><td>0</td>" in page
    assert f"{summary.models[0].share:.0%}</td>" in page


def test_a_file_of_one_model_runs_as_before_with_no_rows_per_model(run_locally: Any, tmp_path: Path) -> None:
    summary: RunSummary = run_locally(
        run_batch_file, input=write(tmp_path, [chat("q1", "sim-a"), chat("q2")]), engine="simulated", model="sim-a"
    )

    assert summary.models == [] and summary.answered == 2
    assert "<h3>Models</h3>" not in final_html(summary, [])


def test_a_run_table_naming_two_models_fails_at_once_saying_an_engine_runs_one(
    run_locally: Any, tmp_path: Path
) -> None:
    from flyteplugins_batcher.jobs import run_table

    table = tmp_path / "questions.jsonl"
    table.write_text('{"question": "hi"}\n')
    with pytest.raises(flyte.errors.RuntimeUserError, match="an engine runs one"):
        run_locally(run_table, input=str(table), prompt="{question}", engine="simulated", model=TWO)
