"""`flyteplugins-batcher run-batch`: an OpenAI-batch JSONL file in, `results.jsonl` and `errors.jsonl` out.

It runs the package's JSONL job (`flyteplugins_batcher.jobs.run_batch_file`, the task behind
`workflows/batch_jsonl.py`) with flyte's local runner. Its options are the job's inputs, spelled as
vLLM's `run-batch` spells the options they share: a file and command line that `vllm run-batch`
takes run here unchanged, but for `-o`, which names a folder here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import rich_click as click

from flyteplugins_batcher.batch_api import EMBEDDINGS_ENDPOINT
from flyteplugins_batcher.cli._options import VLLMStyleCommand, given, input_options, vllm_flags
from flyteplugins_batcher.cli._run import local_file, run_locally
from flyteplugins_batcher.jobs import run_batch_file
from flyteplugins_batcher.replica import EngineSettings, LLMReplica

_JOB = run_batch_file.func
_VLLM_FLAGS = ("enforce_eager",)  # a boolean flag in vLLM, a text field of the job
_ENGINE_FIELDS = tuple(field.name for field in dataclasses.fields(EngineSettings))  # the job's inputs spread them


def _engine_args(engine_args: str, max_num_seqs: int | None) -> str:
    """The job's `engine_args` JSON with `--max-num-seqs` merged in (vLLM's option of that name)."""
    if max_num_seqs is None:
        return engine_args
    try:
        merged: dict[str, Any] = json.loads(engine_args) if engine_args.strip() else {}
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not a JSON object: {error.msg}", param_hint="--engine-args") from None
    if not isinstance(merged, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--engine-args")
    merged["max_num_seqs"] = max_num_seqs
    return json.dumps(merged)


def line_kinds(path: Path, sample: int = 64) -> set[str]:
    """What the file's first lines ask for: "generation", "embedding" (unreadable lines say nothing)."""
    kinds: set[str] = set()
    with path.open("rb") as lines:
        for _, line in zip(range(sample), lines, strict=False):
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if isinstance(request, dict):
                kinds.add("embedding" if request.get("url") == EMBEDDINGS_ENDPOINT else "generation")
    return kinds


def _preload(inputs: dict[str, Any], input_path: Path) -> None:
    """Start loading the LLM now, while flyte starts and the file is read, when the file's lines need it.

    The job's first chunk finds the model loading (or loaded) under the same settings, in this
    process's replica: the load overlaps the rest of the start-up instead of following it.
    """
    if "generation" not in line_kinds(input_path):
        return
    settings = EngineSettings(**{name: inputs[name] for name in _ENGINE_FIELDS if name in inputs})
    LLMReplica.of_process().shared.preload(settings)


def _output_dir(value: Path) -> Path:
    if value.suffix in (".jsonl", ".json") and not value.is_dir():
        raise click.BadParameter(
            f"{value} looks like a file: -o names a folder here, where results.jsonl and errors.jsonl go",
            param_hint="-o/--output-dir",
        )
    return value


@click.command(
    "run-batch", cls=VLLMStyleCommand, context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.option(
    "-i",
    "--input",
    "--input-file",
    "input_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The requests: OpenAI batch lines (chat, completions, embeddings), or plain {custom_id?, prompt | messages}.",
)
@click.option(
    "-o",
    "--output-dir",
    "output_folder",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The folder for results.jsonl and errors.jsonl (created; existing files are replaced).",
)
@click.option(
    "--enforce-eager/--no-enforce-eager",
    default=None,
    show_default="the device's: eager on CPU",
    help="Skip vLLM's graph compilation.",
)
@click.option(
    "--max-num-seqs",
    type=int,
    default=None,
    show_default="vLLM's",
    help="vLLM's sequences per step (into --engine-args).",
)
@vllm_flags
@input_options(_JOB, skip=("input", "output_dir", *_VLLM_FLAGS))
def run_batch(
    input_path: Path,
    output_folder: Path,
    enforce_eager: bool | None,
    max_num_seqs: int | None,
    enable_auto_tool_choice: bool,
    **options: Any,
) -> None:
    """Run every request of a JSONL file, as `vllm run-batch` does, through the batcher.

    Writes OUTPUT_DIR/results.jsonl (OpenAI batch output lines) and OUTPUT_DIR/errors.jsonl (a line
    per failed request, naming its code and the reason), with a progress line and a summary. A bad
    line fails alone. Running it again resumes: finished chunks are reused (--no-resume recomputes).
    Exits non-zero when more requests failed than --max-failed-fraction allows.
    """
    inputs = given(options, _JOB)
    inputs["engine_args"] = _engine_args(inputs.get("engine_args", ""), max_num_seqs)
    if enforce_eager is not None:
        inputs["enforce_eager"] = "true" if enforce_eager else "false"
    folder = _output_dir(output_folder).resolve()
    _preload(inputs, input_path)
    summary = run_locally(run_batch_file, input=local_file(input_path), output_dir=str(folder), **inputs)
    click.echo(f"results: {folder / 'results.jsonl'} ({summary.answered} lines)")
    click.echo(f"errors: {folder / 'errors.jsonl'} ({summary.failed} lines)")
