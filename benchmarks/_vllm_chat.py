"""vLLM's offline `LLM.chat` over every line of a batch file at once, in one process: the limit for `bench_table.py`.

    python benchmarks/_vllm_chat.py -i requests.jsonl -o answers.jsonl --model M --dtype float32 \\
        --max-model-len 2048 --max-num-seqs 256 --kv-cache-gb 2 --enforce-eager

Reads each line's `messages`, `max_tokens` and `temperature` (the OpenAI batch file the other
contenders get), starts `vllm.LLM` with the engine arguments given, calls `LLM.chat` once with every
conversation, and writes one line per answer (`custom_id`, `content`, `completion_tokens`).
`bench_table.py` times this process whole: imports, engine start-up, inference and the answers
written. On stderr it prints the seconds since its start at which each phase ended, and the clock
time at which the answers were written (`phases: {...}`): the benchmark's reference ends there,
before vLLM's engine shuts down and the process exits.

It imports nothing from this repository: it is the plain vLLM program a user would write.
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


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`vllm.LLM`'s keyword arguments: the benchmark's engine arguments, all explicit."""
    return {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "kv_cache_memory_bytes": int(args.kv_cache_gb * 2**30),
        "enforce_eager": args.enforce_eager,
        "seed": 0,
    }


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The batch file's lines, parsed."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("-i", "--input", type=Path, required=True, help="an OpenAI batch file of chat lines")
    parser.add_argument("-o", "--output", type=Path, required=True, help="where the answers go (JSONL)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--kv-cache-gb", type=float, default=2.0)
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    phases = {"imported": time.time() - STARTED}
    lines = read_lines(args.input)
    llm = LLM(model=args.model, **engine_kwargs(args))
    phases["engine_started"] = time.time() - STARTED
    params = [
        SamplingParams(temperature=line["body"].get("temperature", 1.0), max_tokens=line["body"]["max_tokens"])
        for line in lines
    ]
    outputs = llm.chat([line["body"]["messages"] for line in lines], params, use_tqdm=False)
    phases["generated"] = time.time() - STARTED
    with args.output.open("w") as answers:
        for line, output in zip(lines, outputs, strict=True):
            text, tokens = output.outputs[0].text, len(output.outputs[0].token_ids)
            answer = {"custom_id": line["custom_id"], "content": text, "completion_tokens": tokens}
            answers.write(json.dumps(answer) + "\n")
    written_at = time.time()
    phases["written"] = written_at - STARTED
    marks = {name: round(value, 2) for name, value in phases.items()} | {"written_at": written_at}
    print("phases: " + json.dumps(marks), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
