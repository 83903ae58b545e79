"""`flyteplugins-batcher gsm8k`: the demo, gsm8k with batched LLM inference, scored (what `make run` runs)."""

from __future__ import annotations

from typing import Any

import rich_click as click

from flyteplugins_batcher.cli._options import given, input_options
from flyteplugins_batcher.cli._run import run_locally
from flyteplugins_batcher.jobs import solve_gsm8k

_JOB = solve_gsm8k.func


@click.command("gsm8k", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "-o",
    "--output-dir",
    default="",
    help="The folder for answers.jsonl and failed.jsonl; empty: the run's own Flyte storage.",
)
@input_options(_JOB, skip=("output_dir",))
def gsm8k(output_dir: str, **options: Any) -> None:
    """Answer gsm8k questions with batched LLM inference and score them.

    With no model it runs the bundled SmolLM2-135M on CPU, offline (on the bundled sample of
    questions when the Hub is out of reach); pass --model and --source for a real run. Prints a
    progress line, then accuracy and throughput at the model, and where the answers and report are.
    """
    run_locally(solve_gsm8k, output_dir=output_dir, **given(options, _JOB))
