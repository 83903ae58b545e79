"""Structured output on held-out schemas: is every answer that finished valid JSON that follows its schema?

The 8 held-out schemas (`tests/data/held_out_schemas.json`: nested objects, enums, arrays, required
fields, a pattern, a nullable field) and 2 `json_object` prompts, greedy and then 2 samples each at
temperature 0.7 (30 answers per engine), with the bundled SmolLM2-135M and at most 256 tokens, on
the Transformers engine (an `xgrammar` logits processor) and on vLLM in batch and stream mode. An
answer that finished (`"stop"`) must parse and validate; one cut off by `max_tokens` (`"length"`)
is counted apart. The tests check the greedy answers; this gives the whole table.

    python benchmarks/bench_structured.py [--engines transformers,vllm-batch,vllm-stream]
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import benchmark_parser
from benchmarks._tables import markdown_table
from benchmarks.structured_cases import Validity, held_out_requests
from flyteplugins_batcher.engines import create_engine

VLLM_SMALL = {"max_model_len": 1024, "kv_cache_memory_bytes": 1 << 30}


def build(name: str) -> Any:
    if name == "transformers":
        return create_engine("transformers", device="cpu")
    return create_engine("vllm", mode=name.removeprefix("vllm-"), **VLLM_SMALL)


async def score(engine: Any) -> Validity:
    validity = Validity()
    for requests in (held_out_requests(), held_out_requests(temperature=0.7, n=2, seed=0)):
        outcomes = engine.generate(requests)
        validity.add(requests, await outcomes if inspect.isawaitable(outcomes) else outcomes)
    return validity


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--engines", default="transformers,vllm-batch,vllm-stream")
    args = parser.parse_args()
    rows = []
    for name in args.engines.split(","):
        engine = build(name)
        engine.load()
        try:
            validity = asyncio.run(score(engine))
        finally:
            engine.close()
        print(validity.summary(name), flush=True)
        share = f"{validity.valid} ({validity.valid / max(validity.answered, 1):.0%})"
        rows.append([name, validity.answered, share, validity.cut_by_length])
        if validity.failures:
            print("\n".join(validity.failures))
    print()
    print(markdown_table(["engine", "answered (stop)", "parse and validate", "cut by max_tokens (length)"], rows))
    write_chart_data(
        args.chart_data,
        title="Structured output: answers that parse and validate, per engine",
        unit="answers (the rest were cut by max_tokens)",
        rows=[(row[0], int(str(row[2]).split()[0])) for row in rows],
        note="8 held-out schemas and 2 json_object prompts, greedy then 2 samples at temperature 0.7; the bundled "
        "SmolLM2-135M (benchmarks/bench_structured.py).",
        digits=0,
    )


if __name__ == "__main__":
    main()
