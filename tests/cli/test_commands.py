"""The command line as users run it: `flyteplugins-batcher`, `flyte batcher` and `python -m flyteplugins_batcher`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flyteplugins_batcher.cli._gsm8k import gsm8k
from flyteplugins_batcher.cli._run_batch import run_batch
from flyteplugins_batcher.cli._run_table import run_table_command
from flyteplugins_batcher.cli._serve import serve
from flyteplugins_batcher.jobs import run_batch_file, run_table, solve_gsm8k

BIN = Path(sys.executable).parent
REPO_ROOT = Path(__file__).resolve().parents[2]
SIMULATED = ("--engine", "simulated", "--engine-args", '{"time_scale": 0.05}')
COMMANDS = ("run-batch", "run-table", "serve", "gsm8k")


def cli(*arguments: str, cwd: Path | None = None, program: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    command = program or (str(BIN / "flyteplugins-batcher"),)
    return subprocess.run(
        [*command, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )


def chat(custom_id: str, text: str, **body: object) -> str:
    request = {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": request})


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "program",
    [
        (str(BIN / "flyteplugins-batcher"),),
        (str(BIN / "flyte"), "batcher"),
        (sys.executable, "-m", "flyteplugins_batcher"),
    ],
    ids=["console script", "flyte plugin", "python -m"],
)
def test_every_way_in_lists_the_same_commands(program: tuple[str, ...]):
    result = cli("--help", program=program)
    assert result.returncode == 0, result.stderr
    for command in COMMANDS:
        assert command in result.stdout
    assert cli("run-batch", "--help", program=program).returncode == 0
    assert cli("run-table", "--help", program=program).returncode == 0


def test_the_group_imports_no_command_until_one_runs():
    # flyte's CLI loads every plugin's group when it starts: `flyte --help` must not import our jobs or server.
    probe = (
        "import sys, flyteplugins_batcher.cli; print(sorted(m for m in sys.modules if '.jobs' in m or '.server' in m))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("command", "job", "own"),
    [
        (run_batch, run_batch_file.func, {"input", "output_dir", "output_file"}),  # -o takes both
        (run_table_command, run_table.func, {"input", "output_dir", "response_format"}),
        (gsm8k, solve_gsm8k.func, {"output_dir"}),
    ],
    ids=["run-batch", "run-table", "gsm8k"],
)
def test_a_job_command_has_a_flag_for_every_input_of_its_job_with_the_jobs_default(command, job, own):
    import inspect

    options = {option.name: option for option in command.params}
    for name, parameter in inspect.signature(job).parameters.items():
        if name in own:
            continue
        assert name in options, f"--{name} is missing"
        if name != "enforce_eager":  # vLLM's boolean flag; the job takes text
            assert options[name].default == parameter.default
    shown = cli(command.name, "--help").stdout
    for option in command.params:
        assert option.opts[-1] in shown or option.opts[0] in shown
    assert shown.count("[default: ") == len([option for option in command.params if not option.required])


def test_serve_has_a_flag_for_every_server_and_engine_setting_with_its_default():
    import dataclasses

    from flyteplugins_batcher.replica import EngineSettings
    from flyteplugins_batcher.server import ServerSettings

    options = {option.name: option for option in serve.params}
    for settings in (ServerSettings(), EngineSettings()):
        for item in dataclasses.fields(settings):
            if item.name == "engine" and isinstance(settings, ServerSettings):
                continue
            assert options[item.name].default == getattr(settings, item.name)


def test_run_batch_exits_0_with_each_failed_line_in_its_place_and_fails_past_an_opted_in_threshold(tmp_path: Path):
    # vLLM's contract: a run whose every line is answered or failed in its own line exits 0.
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join([chat("a", "What is 2 + 2?"), "not json", chat("b", "Name a prime.")]) + "\n")

    ran = cli("run-batch", "-i", str(requests), "-o", str(tmp_path / "out"), *SIMULATED)
    assert ran.returncode == 0, ran.stderr
    assert "answered 2/3 requests, 1 failed" in ran.stdout
    results, errors = lines(tmp_path / "out" / "results.jsonl"), lines(tmp_path / "out" / "errors.jsonl")
    assert [line["response"]["status_code"] for line in results] == [200, 200]
    assert [(line["custom_id"], line["error"]["code"], line["error"]["line"]) for line in errors] == [
        ("line-2", "invalid_json", 2)  # a string id, as OpenAI's and vLLM's output types require
    ]

    strict = cli("run-batch", "-i", str(requests), "-o", str(tmp_path / "strict"), "--max-failed-fraction", "0.2")
    assert strict.returncode == 1
    assert "1 of 3 requests failed" in " ".join(strict.stderr.split())
    assert [line["custom_id"] for line in lines(tmp_path / "strict" / "results.jsonl")] == ["a", "b"]  # still written


def test_run_batch_writes_vllms_one_output_file_in_input_order_for_an_output_file_path(tmp_path: Path):
    requests = tmp_path / "requests.jsonl"
    written = [chat(f"q{n}", f"Count to {n}.") for n in range(12)]
    written[3], written[8] = "{broken", json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}})
    requests.write_text("\n".join(written) + "\n")
    output = tmp_path / "answers" / "out.jsonl"

    ran = cli("run-batch", "-i", str(requests), "-o", str(output), "--chunk-size", "2", *SIMULATED)
    assert ran.returncode == 0, ran.stderr
    assert f"output: {output} (10 answered, 2 failed)" in ran.stdout
    assert sorted(path.name for path in output.parent.iterdir()) == ["out.jsonl"]  # one file, nothing beside it
    answered = lines(output)
    expected = [f"q{n}" for n in range(12)]
    expected[3], expected[8] = "line-4", "line-9"
    assert [line["custom_id"] for line in answered] == expected  # input order, the errors in their places
    assert [line["error"]["code"] for line in answered if line["error"]] == ["invalid_json", "missing_custom_id"]


def test_run_batch_of_an_empty_file_writes_an_empty_result_and_exits_0(tmp_path: Path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n  \n")
    ran = cli("run-batch", "-i", str(requests), "-o", str(tmp_path / "out.jsonl"), *SIMULATED)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "out.jsonl").read_text() == "" and "answered 0/0 requests" in ran.stdout


def test_a_file_naming_the_model_as_vllm_run_batch_takes_it_runs_unchanged(tmp_path: Path):
    # `vllm run-batch --model PATH` answers lines whose body.model is PATH: so do we, and by the name we serve.
    model = "/models/Qwen2.5-0.5B-Instruct"
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        "\n".join([chat("path", "hi", model=model), chat("name", "hi", model="Qwen2.5-0.5B-Instruct")]) + "\n"
    )
    result = cli("run-batch", "-i", str(requests), "-o", str(tmp_path / "out"), "--model", model, *SIMULATED)
    assert result.returncode == 0, result.stderr
    answered = lines(tmp_path / "out" / "results.jsonl")
    assert {line["custom_id"] for line in answered} == {"path", "name"}
    assert [line["response"]["body"]["model"] for line in answered] == [model, model]  # --model echoed as given

    renamed = cli(
        "run-batch", "-i", str(requests), "-o", str(tmp_path / "renamed"), "--model", model,
        "--served-model-name", "qwen", "--max-failed-fraction", "1", *SIMULATED,
    )  # fmt: skip
    assert renamed.returncode == 0, renamed.stderr
    answered = lines(tmp_path / "renamed" / "results.jsonl")
    assert [line["response"]["body"]["model"] for line in answered] == ["qwen", "qwen"]  # the served name


def test_the_gsm8k_command_runs_the_demo(tmp_path: Path):
    result = cli("gsm8k", "--num-questions", "4", "--source", "sample", "-o", str(tmp_path), *SIMULATED)
    assert result.returncode == 0, result.stderr
    assert "answered 4/4 questions" in result.stdout
    assert len(lines(tmp_path / "answers.jsonl")) == 4


def test_run_batch_starts_loading_the_model_before_the_job_and_the_job_uses_that_load(tmp_path: Path):
    # In-process, to see the replica: the preload and the job's first chunk must agree on the engine's settings,
    # else the job would load a second engine.
    import asyncio

    from click.testing import CliRunner

    from flyteplugins_batcher.replica import LLMReplica

    requests = tmp_path / "requests.jsonl"
    requests.write_text(chat("a", "hi") + "\n" + chat("b", "ho") + "\n")
    replica = LLMReplica()
    replica.install()
    try:
        loads = []
        original = replica.shared.preload
        replica.shared.preload = lambda key: loads.append(key) or original(key)  # type: ignore[method-assign]
        result = CliRunner().invoke(
            run_batch,
            ["-i", str(requests), "-o", str(tmp_path / "out"), "--max-new-tokens", "5", "--no-resume", *SIMULATED],
        )
        assert result.exit_code == 0, result.output
        assert len(loads) == 1 and loads[0].max_new_tokens == 5
        assert replica.shared.loads == 1  # the job's chunks ran on the preloaded engine
    finally:
        asyncio.run(replica.aclose())


def test_a_file_of_embeddings_alone_preloads_no_llm(tmp_path: Path):
    from flyteplugins_batcher.cli._run_batch import line_kinds

    embedding = {"custom_id": "e", "url": "/v1/embeddings", "body": {"input": "x"}}
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(embedding) + "\n{broken\n")
    assert line_kinds(path) == {"embedding"}
    path.write_text(json.dumps(embedding) + "\n" + chat("a", "hi") + "\n")
    assert line_kinds(path) == {"embedding", "generation"}


HOOKS = """
def ask(row):
    return {"messages": [{"role": "user", "content": "Q: " + row["question"]}], "max_tokens": row["budget"]}


def words(row):
    return {"words": len(row["generated_text"].split())}
"""


def test_run_table_answers_each_row_with_hooks_of_this_folder_and_exits_non_zero_when_rows_fail(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "my_hooks.py").write_text(HOOKS)  # a module of the folder the command runs in, as `flyte run` finds it
    table = pa.table({"question": ["What is 2 + 2?", None, "Name a prime."], "budget": [3, 4, 5]})
    pq.write_table(table, tmp_path / "questions.parquet")
    hooks = ("--preprocess", "my_hooks:ask", "--postprocess", "my_hooks:words")
    command = ("run-table", "-i", "questions.parquet", *hooks, *SIMULATED)

    failed = cli(*command, "-o", "strict", cwd=tmp_path)
    assert failed.returncode == 1
    assert "1 of 3 rows failed" in " ".join(failed.stderr.split())
    assert pq.read_table(tmp_path / "strict").num_rows == 3  # still written

    accepted = cli(*command, "-o", "out", "--max-failed-fraction", "0.5", cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    assert "answered 2/3 rows, 1 failed, 2 reused from an earlier run" in accepted.stdout  # the first run's chunks
    out = pq.read_table(tmp_path / "out").to_pylist()
    assert [row["num_generated_tokens"] for row in out] == [3, None, 5]
    assert out[1]["error"].startswith("preprocess_failed: TypeError")  # "Q: " + None
    assert [row["words"] for row in out] == [
        len(out[0]["generated_text"].split()),
        None,
        len(out[2]["generated_text"].split()),
    ]


def test_run_table_builds_a_typed_answer_column_from_a_json_schema_file(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = {"type": "object", "properties": {"answer": {"type": "integer"}, "why": {"type": ["string", "null"]}}}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    pq.write_table(pa.table({"question": ["What is 2 + 2?"]}), tmp_path / "q.parquet")
    result = cli(
        "run-table", "-i", "q.parquet", "-o", "out", "--prompt", "{question}", "--response-format", "schema.json",
        *SIMULATED, cwd=tmp_path,
    )  # fmt: skip
    # The simulated engine writes filler, not JSON: the row fails, saying why, and with it the run, once written.
    assert result.returncode == 1 and "1 of 1 rows failed" in " ".join(result.stderr.split())
    out = pq.read_table(tmp_path / "out")
    assert out.schema.field("generated_text").type == pa.struct([("answer", pa.int64()), ("why", pa.string())])
    assert out.column("error")[0].as_py().startswith("invalid_answer: the answer is not JSON that fits the schema")


def test_run_table_refuses_an_unreadable_table_before_anything_runs(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("hello")
    result = cli("run-table", "-i", "notes.txt", "-o", "out", "--prompt", "{question}", *SIMULATED, cwd=tmp_path)
    assert result.returncode == 1
    assert "cannot read 'notes.txt' as a table" in " ".join(result.stderr.split())


def test_flyte_run_takes_the_table_example_with_a_jsonl_path_as_its_input(tmp_path: Path):
    # flyte's CLI wraps the path as a flyte.io.DataFrame that says "parquet": the file's own suffix must win.
    import pyarrow.parquet as pq

    rows = [{"question": f"What is {n} + {n}? ({tmp_path.name})"} for n in range(3)]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    result = cli(
        "run", "--local", "workflows/table.py", "main", "--input", str(tmp_path / "q.jsonl"), "--prompt", "{question}",
        "--output_dir", str(tmp_path / "out"), "--engine", "simulated", "--engine_args", '{"time_scale": 50}',
        cwd=REPO_ROOT, program=(str(BIN / "flyte"),),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = pq.read_table(tmp_path / "out")
    assert (
        out.column("question").to_pylist() == [row["question"] for row in rows] and out.column("error").null_count == 3
    )
