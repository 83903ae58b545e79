"""`flyteplugins-batcher run-table`: a table in, the same table out with each row's answer, as a Parquet dataset.

It runs the package's table job (`flyteplugins_batcher.jobs.run_table`, the task behind
`workflows/table.py`) with flyte's local runner, in this process. Its options are the job's
inputs (`--prompt`, `--messages-column`, `--column`, `--preprocess`, `--postprocess`,
`--output-column`, `--task`, every `RunOptions` and `EngineSettings` field), with vLLM's spellings
of the engine options where they exist, as `run-batch` has them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import rich_click as click

from flyteplugins_batcher.cli._engine_flags import VLLM_FLAGS, apply_vllm_flags, preload, vllm_flags
from flyteplugins_batcher.cli._options import VLLMStyleCommand, given, input_options
from flyteplugins_batcher.cli._run import run_locally
from flyteplugins_batcher.jobs import run_table

_JOB = run_table.func


def _located(text: str) -> str:
    """A local path made absolute (the job may run elsewhere than this folder); a URI or a Hub name as it is."""
    return text if "://" in text or not Path(text).expanduser().exists() else str(Path(text).expanduser().resolve())


def _output(text: str) -> str:
    return text if "://" in text else str(Path(text).expanduser().resolve())


def _schema_text(value: str) -> str:
    """The JSON schema `--response-format` gives: a file's text, or the JSON text itself."""
    if value.lstrip().startswith("{"):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise click.BadParameter(
            f"{value} is no file (give a JSON schema file, or its JSON text)", param_hint="--response-format"
        )
    return path.read_text(encoding="utf-8")


@click.command(
    "run-table", cls=VLLMStyleCommand, context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.option(
    "-i",
    "--input",
    "input_table",
    required=True,
    help="The table: a Parquet, CSV or JSONL file or folder (local, or s3://, gs://, ...), a Hugging Face dataset "
    "saved with save_to_disk (PATH, PATH:SPLIT), or named on the Hub (NAME, NAME:SPLIT, NAME:CONFIG:SPLIT).",
)
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    help="Where the output Parquet dataset goes: a folder (created; it may hold only an earlier run's parts) or a URI.",
)
@click.option(
    "--response-format",
    "response_format",
    default=None,
    show_default="none: text answers",
    help="A JSON schema file (or its JSON text) that answers follow: the answer column is a struct built from it.",
)
@click.option(
    "--task",
    "--task-type",
    "task_type",
    type=click.Choice(["generate", "embed", "score", "classify"]),
    default="generate",
    help="generate: an LLM answer per row (LLM replicas); embed: a vector per row from --column (embedding replicas); "
    "score: a score per row for --query-column and --document-column (the embedding model's cosine similarity, or "
    "the model's when it is a cross-encoder); classify: --column's label and probabilities (the model must be a "
    "sequence classifier).",
)
@vllm_flags
@input_options(_JOB, skip=("input", "output_dir", "response_format", "task_type", *VLLM_FLAGS))
def run_table_command(
    input_table: str,
    output: str,
    response_format: str | None,
    task_type: str,
    enforce_eager: bool | None,
    max_num_seqs: int | None,
    **options: Any,
) -> None:
    """Answer every row of a table with an LLM (or embed it), as Ray Data LLM's processors do, through the batcher.

    Writes OUTPUT, a Parquet dataset that pandas.read_parquet and pyarrow.parquet.read_table read
    whole: a row per input row, in order, with every input column, the answer (generated_text, or
    --output-column), num_input_tokens, num_generated_tokens and error (null where the row
    succeeded). A bad row fails alone. Running it again resumes: finished chunks are reused
    (--no-resume recomputes). Exits non-zero when more rows failed than --max-failed-fraction allows.
    """
    sys.path.insert(0, os.getcwd())  # --preprocess and --postprocess name modules of this folder, as `flyte run` does
    inputs = apply_vllm_flags(given(options, _JOB), enforce_eager, max_num_seqs) | {"task_type": task_type}
    if response_format is not None:
        inputs["response_format"] = _schema_text(response_format)
    if task_type in ("generate", "score", "classify"):
        preload(inputs, llm=task_type == "generate")  # the model (an LLM, or a classifier) loads while flyte starts
    summary = run_locally(run_table, input=_located(input_table), output_dir=_output(output), **inputs)
    click.echo(f"output: {summary.output.uri} ({summary.requests} rows, {summary.failed} failed)")
