"""Options declared once: spread into every workflow's inputs, documented in its `--help`, reaching the replica."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

import flyte
import pytest

from flyteplugins_batcher.jobs import DeclaredOption, RunOptions, run_batch_file, solve_gsm8k
from flyteplugins_batcher.jobs._options import option_help, spread_options, task_with_options
from flyteplugins_batcher.replica import EngineSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
LLM_WORKFLOWS = {"workflows/batch_llm.py": solve_gsm8k, "workflows/batch_jsonl.py": run_batch_file}
SHARED_OPTION_SETS = (EngineSettings, RunOptions)

env = flyte.TaskEnvironment(name="options_test")


@dataclass(frozen=True)
class Sampling:
    """How to sample.

    Attributes:
        temperature: 0 for greedy decoding.
        stop: Where to stop.
    """

    temperature: float = 0.0
    stop: str = ""


@dataclass(frozen=True)
class Undocumented:
    """No attributes section."""

    depth: int = 1


@task_with_options(env)
async def echo(prompt: str, sampling: Sampling = Sampling(stop="\n")) -> str:
    """Show what the function received.

    Args:
        prompt: The prompt.
        sampling: How to sample.
    """
    return f"{prompt}|{sampling!r}"


def cli(*arguments: str) -> str:
    """`flyte <arguments>` as a user runs it, with lines wide enough that help texts are not wrapped."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("flyte")), *arguments],
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_an_option_set_becomes_one_input_per_field_and_comes_back_whole(run_locally):
    assert list(echo.native_interface.inputs) == ["prompt", "temperature", "stop"]
    assert run_locally(echo, prompt="hi", temperature=0.7) == f"hi|{Sampling(temperature=0.7, stop=chr(10))!r}"
    assert run_locally(echo, prompt="hi") == f"hi|{Sampling(stop=chr(10))!r}"  # the function's own defaults


def test_each_input_is_documented_once_from_where_it_is_declared():
    assert echo.native_interface.docstring.input_descriptions == {
        "prompt": "The prompt.",
        "temperature": "0 for greedy decoding.",
        "stop": "Where to stop.",
    }


def test_a_declared_option_has_its_type_unwrapped_its_default_and_its_help_from_one_reading() -> None:
    @dataclass(frozen=True)
    class Limits:
        """Limits.

        Attributes:
            depth: How deep, or no limit.
            names: Which names.
        """

        depth: int | None = None
        names: list[str] = field(default_factory=lambda: ["a"])

    async def job(prompt: str, tries: typing.Optional[int] = 2) -> None:  # noqa: UP045 (the old spelling, too)
        """Run.

        Args:
            prompt: The prompt.
            tries: How many tries.
        """

    assert DeclaredOption.fields_of(Limits) == [
        DeclaredOption("depth", int, True, None, "How deep, or no limit."),
        DeclaredOption("names", list[str], False, ["a"], "Which names."),
    ]
    prompt, tries = DeclaredOption.inputs_of(job)
    assert (prompt.kind, prompt.optional, prompt.help) == (str, False, "The prompt.")
    assert (tries.kind, tries.optional, tries.default, tries.help) == (int, True, 2, "How many tries.")
    with pytest.raises(TypeError, match="Undocumented: document depth"):
        DeclaredOption.fields_of(Undocumented)


def test_an_undocumented_field_an_input_declared_twice_or_an_option_set_without_default_is_refused():
    async def takes_undocumented(options: Undocumented = Undocumented()) -> None:
        """Nothing."""

    async def declares_temperature_twice(temperature: float = 0.0, sampling: Sampling = Sampling()) -> None:
        """Nothing."""

    async def lacks_a_default(sampling: Sampling) -> None:
        """Nothing."""

    with pytest.raises(TypeError, match="Undocumented: document depth"):
        spread_options(takes_undocumented)
    with pytest.raises(TypeError, match="inputs temperature come from more than one place"):
        spread_options(declares_temperature_twice)
    with pytest.raises(TypeError, match="option set 'sampling' needs a default Sampling"):
        spread_options(lacks_a_default)


@pytest.mark.parametrize("option_set", SHARED_OPTION_SETS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("workflow", LLM_WORKFLOWS.values(), ids=LLM_WORKFLOWS.keys())
def test_every_shared_option_is_an_input_of_every_llm_workflow_with_its_help(workflow, option_set):
    interface = workflow.native_interface
    types = typing.get_type_hints(option_set)
    for name, help_text in option_help(option_set).items():
        assert name in interface.inputs, f"{workflow.name} lacks --{name}"
        assert interface.inputs[name][0] == types[name]
        assert interface.docstring.input_descriptions[name] == help_text


@pytest.mark.parametrize("path", LLM_WORKFLOWS)
def test_the_cli_help_lists_every_shared_option_with_its_help(path: str):
    shown = " ".join(cli("run", "--local", path, "main", "--help").replace("`", "").split())
    for option_set in SHARED_OPTION_SETS:
        for name, help_text in option_help(option_set).items():
            assert f"--{name}: {help_text.replace('`', '')}" in shown


@pytest.mark.slow
@pytest.mark.parametrize("path", LLM_WORKFLOWS)
def test_an_engine_option_given_on_the_command_line_reaches_the_replica(path: str, tmp_path: Path):
    requests = tmp_path / "requests.jsonl"
    story = "Write a long story about a lighthouse keeper and the sea."
    requests.write_text("\n".join(json.dumps({"custom_id": f"r{n}", "prompt": f"{story} ({n})"}) for n in range(2)))
    inputs = ["--input", str(requests)] if path.endswith("jsonl.py") else ["--source", "sample", "--num_questions", "2"]

    cli("run", "--local", path, "main", *inputs, "--max_new_tokens", "3", "--no-resume", "--output_dir", str(tmp_path))

    if path.endswith("jsonl.py"):
        lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
        tokens = [line["response"]["body"]["usage"]["completion_tokens"] for line in lines]
    else:
        tokens = [
            json.loads(line)["completion_tokens"] for line in (tmp_path / "answers.jsonl").read_text().splitlines()
        ]
    assert tokens == [3, 3]
