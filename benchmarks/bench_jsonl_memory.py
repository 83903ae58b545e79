"""The JSONL driver's memory on huge inputs: peak memory for 20k vs 200k request lines (goal: within 1.5x).

The driver of `workflows/batch_jsonl.py` (its `Job`: streaming parse, duplicate-id check, bounded
chunks in flight, results written as chunks finish) runs here against a trivial engine that answers
instantly, so what is measured is the driver alone. Each size runs in a fresh process; reported are
the process's peak resident memory and the peak of Python allocations (tracemalloc).

    python benchmarks/bench_jsonl_memory.py            # 20 000 and 200 000 lines
    python benchmarks/bench_jsonl_memory.py --sizes 1000,10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import (
    add_fresh_process_flag,
    add_order_flags,
    benchmark_parser,
    in_fresh_process,
    memory_table,
    order_words,
    peak_memory,
)


def write_requests(path: Path, count: int) -> None:
    with path.open("w") as handle:
        for number in range(count):
            body = {"messages": [{"role": "user", "content": f"Question number {number}: what is {number} + 1?"}]}
            line = {"custom_id": f"request-{number}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            handle.write(json.dumps(line) + "\n")


async def run_driver(path: Path, args: argparse.Namespace) -> int:
    from flyteplugins_batcher.jobs._driver import fan_out
    from flyteplugins_batcher.jobs._jsonl.job import Job
    from flyteplugins_batcher.replica import ChunkOutcome, EngineSettings, ItemResult, ReplicaSnapshot, RequestChunk

    async def answer(chunk: RequestChunk) -> ChunkOutcome:  # a trivial engine: echo, at once
        await asyncio.sleep(0)
        results = [ItemResult(item.key, item.messages[0].content[::-1], "stop", 10, 5) for item in chunk.items]
        return ChunkOutcome(chunk.index, results, ReplicaSnapshot(replica="trivial"), finished_at=time.time())

    job = Job(
        path,
        Path(tempfile.mkdtemp(prefix="jsonl-memory-")),
        EngineSettings(),
        served_model_name="trivial",
        served_embedding_model="trivial",
        model_mismatch="error",
        order=args.order,
        window=args.order_window,
    )
    try:
        await fan_out(job.chunks(args.chunk_size), answer, job.on_chunk, max_in_flight=args.max_chunks_in_flight)
    finally:
        job.close()
    return job.counts.done


def measure(count: int, args: argparse.Namespace) -> dict[str, float]:
    """Run the driver over `count` lines in this process (call in a fresh one)."""
    import flyte

    flyte.init()
    folder = Path(tempfile.mkdtemp(prefix="jsonl-input-"))
    path = folder / "requests.jsonl"
    write_requests(path, count)
    done, figures = peak_memory(lambda: asyncio.run(run_driver(path, args)))
    assert done == count, f"{done} of {count} requests done"
    return {"lines": count, **figures, "input_mib": path.stat().st_size / 2**20}


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--sizes", default="20000,200000", help="comma-separated line counts")
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--max-chunks-in-flight", type=int, default=16)
    add_order_flags(parser)
    add_fresh_process_flag(parser)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    rows = [in_fresh_process(__file__, int(size)) for size in args.sizes.split(",")]
    print(
        f"\nJSONL driver, chunks of {args.chunk_size}, at most {args.max_chunks_in_flight} in flight, "
        f"{order_words(args)}\n"
    )
    print(memory_table(rows, "lines"))
    write_chart_data(
        args.chart_data,
        title="The JSONL driver's peak memory against the file's size",
        unit="peak RSS in MiB, each size in a fresh process",
        rows=[(f"{row['lines']:,} lines ({row['input_mib']:.1f} MiB)", row["peak_rss_mib"]) for row in rows],
        note=f"A trivial engine that answers at once; chunks of {args.chunk_size}, at most "
        f"{args.max_chunks_in_flight} in flight, {order_words(args)} (benchmarks/bench_jsonl_memory.py).",
        digits=0,
    )


if __name__ == "__main__":
    main()
