"""`flyteplugins-batcher run-batch`: an OpenAI-batch JSONL file in, vLLM's output file (or a folder) out.

It runs the package's JSONL job (`flyteplugins_batcher.jobs.run_batch_file`, the task behind
`workflows/batch_jsonl.py`) with flyte's local runner. Its options are the job's inputs, spelled as
vLLM's `run-batch` spells the options they share, and it keeps vLLM's contract: a file and command
line that `vllm run-batch` takes run here unchanged, `-o FILE` is one output file in input order with
the errors inline, and the exit code is 0 once every line is answered or failed in its own line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import rich_click as click

from flyteplugins_batcher.batch_api import EmbeddingRequest
from flyteplugins_batcher.cli._engine_flags import VLLM_FLAGS, apply_vllm_flags, preload, vllm_flags
from flyteplugins_batcher.cli._options import VLLMStyleCommand, given, input_options
from flyteplugins_batcher.cli._run import local_file, run_locally
from flyteplugins_batcher.jobs import run_batch_file

_JOB = run_batch_file.func


def line_kinds(path: Path, sample: int = 64) -> set[str]:
    """What the file's first lines ask for: "generation", "embedding" (an encoder's: embeddings, score, rerank,
    classify; unreadable lines say nothing)."""
    return {kind for kind, _ in _first_requests(path, sample)}


def first_model(path: Path, sample: int = 64) -> str | None:
    """The model the file's first chat or completion line names (`None`: it names none, or none of the first lines
    is one): of several base models, the job runs that one's lines first."""
    return next((model for kind, model in _first_requests(path, sample) if kind == "generation"), None)


def _first_requests(path: Path, sample: int) -> list[tuple[str, str | None]]:
    """Each of the file's first lines that reads as a request: its kind and the model its body names."""
    found: list[tuple[str, str | None]] = []
    with path.open("rb") as lines:
        for _, line in zip(range(sample), lines, strict=False):
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if isinstance(request, dict):
                body = request.get("body")
                model = body.get("model") if isinstance(body, dict) else None
                kind = "embedding" if request.get("url") in EmbeddingRequest.URLS else "generation"
                found.append((kind, model if isinstance(model, str) else None))
    return found


OUTPUT_FILE_SUFFIXES = (".jsonl", ".json")
"""An `-o` path with one of these suffixes (or an existing file) is vLLM's one output file; anything else a folder."""


def is_output_file(value: Path) -> bool:
    """Whether `-o value` names vLLM's one output file (`out.jsonl`, an existing file), else a folder of two files."""
    if value.is_dir():
        return False
    return value.is_file() or value.suffix.lower() in OUTPUT_FILE_SUFFIXES


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
    help="The requests: OpenAI batch lines (chat, completions, responses, embeddings; vLLM's score, rerank, classify), "
    "or plain {custom_id?, prompt | messages}.",
)
@click.option(
    "-o",
    "--output-file",
    "--output-dir",
    "output",
    required=True,
    type=click.Path(path_type=Path),
    help="FILE.jsonl (or .json, or an existing file): vLLM's one output file, every line's result or error in "
    "input order. Anything else is a folder for results.jsonl and errors.jsonl. Existing files are replaced.",
)
@vllm_flags
@input_options(_JOB, skip=("input", "output_dir", "output_file", *VLLM_FLAGS))
def run_batch(
    input_path: Path, output: Path, enforce_eager: bool | None, max_num_seqs: int | None, **options: Any
) -> None:
    """Run every request of a JSONL file, as `vllm run-batch` does, through the batcher.

    `-o out.jsonl` writes vLLM's output file: a line per request, in input order, each a result or an
    error (a bad line fails alone, naming its code and the reason). `-o DIR` writes DIR/results.jsonl
    and DIR/errors.jsonl instead. With a progress line, a summary and a report. Running it again
    resumes: finished chunks are reused (--no-resume recomputes). Exits 0 once every line is answered
    or failed in its own line, as vLLM does (an empty file too); --max-failed-fraction opts in to a
    non-zero exit past that share of failed lines.
    """
    inputs = apply_vllm_flags(given(options, _JOB), enforce_eager, max_num_seqs)
    target = {"output_file" if is_output_file(output) else "output_dir": str(output.resolve())}
    kinds = line_kinds(input_path)
    if kinds:  # the model loads while flyte starts and the file is read
        preload(inputs, first_model(input_path), llm="generation" in kinds)
    summary = run_locally(run_batch_file, input=local_file(input_path), **target, **inputs)
    if "output_file" in target:
        click.echo(f"output: {target['output_file']} ({summary.answered} answered, {summary.failed} failed)")
        return
    click.echo(f"results: {output.resolve() / 'results.jsonl'} ({summary.answered} lines)")
    click.echo(f"errors: {output.resolve() / 'errors.jsonl'} ({summary.failed} lines)")
