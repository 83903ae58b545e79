"""What the commands that run an LLM job share: vLLM's spellings of two engine options, and loading the model early.

- `--enforce-eager/--no-enforce-eager`: a boolean flag in vLLM, a text field of the jobs' `EngineSettings`.
- `--max-num-seqs`: vLLM's option of that name, merged into `--engine-args`.
- `preload`: the model starts loading while flyte starts and the input is read; the job's first chunk
  finds it loading (or loaded) under the same settings, in this process's replica.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import rich_click as click

from flyteplugins_batcher.cli._options import accepted_vllm_flags
from flyteplugins_batcher.engines import EngineConfigError
from flyteplugins_batcher.replica import EmbeddingReplica, EngineSettings, LLMReplica

VLLM_FLAGS = ("enforce_eager",)
"""Job inputs that the commands spell as vLLM does (a boolean flag here, text in the job)."""

_ENGINE_FIELDS = tuple(field.name for field in dataclasses.fields(EngineSettings))  # the jobs' inputs spread them


def vllm_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add `--enforce-eager/--no-enforce-eager` and `--max-num-seqs` to a command (`apply_vllm_flags` reads them),
    and the vLLM flags taken as vLLM takes them (`accepted_vllm_flags`)."""
    command = accepted_vllm_flags(command)
    command = click.option(
        "--max-num-seqs",
        type=int,
        default=None,
        show_default="vLLM's",
        help="vLLM's sequences per step (into --engine-args).",
    )(command)
    return click.option(
        "--enforce-eager/--no-enforce-eager",
        default=None,
        show_default="the device's: eager on CPU",
        help="Skip vLLM's graph compilation.",
    )(command)


def apply_vllm_flags(inputs: dict[str, Any], enforce_eager: bool | None, max_num_seqs: int | None) -> dict[str, Any]:
    """The job's inputs with the two vLLM flags written in: `enforce_eager` as text, `max_num_seqs` into `engine_args`.

    Raises:
        click.BadParameter: `--engine-args` is not a JSON object.
    """
    inputs["engine_args"] = _engine_args(inputs.get("engine_args", ""), max_num_seqs)
    if enforce_eager is not None:
        inputs["enforce_eager"] = "true" if enforce_eager else "false"
    return inputs


def preload(inputs: dict[str, Any], named: str | None = None, *, llm: bool = True) -> None:
    """Start loading the model the job's inputs ask for, in this process's replica, now: the LLM, or the
    classifier (a cross-encoder given as the model).

    Args:
        inputs: The job's inputs.
        named: The model (or adapter) the input's first line names: of several base models, the job runs
            that one's lines first (the first declared, when it names none of them).
        llm: Whether the job needs the LLM (its input has chat or completion lines); a classifier loads anyway.
    """
    settings = EngineSettings(**{name: inputs[name] for name in _ENGINE_FIELDS if name in inputs})
    try:
        models = settings.served_models(inputs.get("served_model_name", ""))
        classifier = bool(settings.classifier_tasks())
    except EngineConfigError:
        return  # the job fails with this error, where it is reported
    if classifier:  # a cross-encoder or classifier: its encoder replica's model loads instead of an LLM
        threading.Thread(target=EmbeddingReplica.for_settings(settings).model.load, daemon=True).start()
        return
    if not llm:
        return
    first = next((model for model in models if named in (*model.names, *model.adapter_names)), models[0])
    loading = LLMReplica.of_process().preload(settings.for_model(first))
    if settings.engine == "vllm":
        _until_engine_process_starts(loading)


def _until_engine_process_starts(loading: concurrent.futures.Future[Any], limit_s: float = 60.0) -> None:
    """Wait until vLLM has started its engine process (or the load ended, or `limit_s` passed).

    vLLM's start in this process (its import, its configuration: 6 s on the CPU build) is pure Python: with
    flyte starting beside it in this thread, the two share the interpreter's lock and the engine process
    started 2.3 s later than `vllm run-batch`'s. Once that process runs, it loads the model on a core of
    its own while flyte starts here.
    """
    deadline = time.monotonic() + limit_s
    while not (multiprocessing.active_children() or loading.done() or time.monotonic() > deadline):
        time.sleep(0.05)


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
