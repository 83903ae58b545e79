"""The table job's memory on big tables: peak memory for 20k vs 200k rows (goal: at most 1.1x).

The table job's driver (`run_table_job`, the body of `run_table`, what `flyteplugins-batcher
run-table` runs) goes over a Parquet table of short questions in this process, as
`bench_jsonl_memory.py` runs the JSONL driver. The replica's task is called as a plain function, in
the same process, with the simulated engine (vLLM's scheduling with an H100's step times,
`time_scale` times faster than real time, answers of `--max-new-tokens` tokens). What is measured
is the driver: it reads the table by row groups, makes each row's request, keeps chunks in flight
(64 rows, 32 at a time: 2,048 rows, as the default 8 x 256), writes each chunk's Parquet part as it
finishes and publishes the parts. The replica's queue is bounded by the chunks in flight.
`--via-runner` goes through flyte's local runner instead. Each size runs in a fresh process.
Each size's process starts with the allocator settings of the driver task's container
(`--allocators driver`: two glibc malloc arenas, Arrow on the system allocator), as a driver on a
cluster runs; `--allocators default` leaves glibc's and Arrow's own.
Reported are the process's peak resident memory, taken before the output is checked, and the peak
of Python allocations (tracemalloc).

    python benchmarks/bench_table_memory.py            # 20 000 and 200 000 rows
    python benchmarks/bench_table_memory.py --sizes 1000,10000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
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
from flyteplugins_batcher.jobs._environments import DRIVER_ALLOCATOR_ENV


def write_table(path: Path, count: int, row_group: int = 10_000) -> None:
    """A Parquet table of `count` short questions, written by row groups of `row_group` (as big tables are made).

    Written a row group at a time, so that making the input does not raise the process's peak memory.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.int64()), ("question", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, count, row_group):
            numbers = range(start, min(start + row_group, count))
            texts = [f"Question number {number}: what is {number} + 1?" for number in numbers]
            writer.write_table(pa.table({"id": list(numbers), "question": texts}, schema=schema))


def run_job(path: Path, out: Path, args: argparse.Namespace) -> tuple[int, int]:
    """The table job over `path`: its driver called in this process, or through flyte's local runner."""
    import asyncio

    import flyte

    from flyteplugins_batcher.jobs import RunOptions, run_table
    from flyteplugins_batcher.jobs._table.driver import run_table_job
    from flyteplugins_batcher.jobs._table.options import TableOptions
    from flyteplugins_batcher.replica import EngineSettings

    engine_args = json.dumps({"time_scale": args.time_scale, "gpu": {"max_model_len": 512}})
    settings = EngineSettings(engine="simulated", engine_args=engine_args, max_new_tokens=args.max_new_tokens)
    run = RunOptions(
        chunk_size=args.chunk_size,
        max_chunks_in_flight=args.max_chunks_in_flight,
        resume=False,
        output_dir=str(out),
        order=args.order,
        order_window=args.order_window,
    )
    rows = TableOptions(prompt="{question}")
    if args.via_runner:
        summary = flyte.with_runcontext(mode="local").run(run_table, str(path), rows, run, settings).outputs()[0]
    else:  # the replica's task runs as a plain call in this process: the driver and one replica, no runner
        summary = asyncio.run(run_table_job(str(path), rows, run, settings))
    return summary.requests, summary.failed


def measure(count: int, args: argparse.Namespace) -> dict[str, float]:
    """Run the table job over `count` rows in this process (call in a fresh one)."""
    import flyte
    import pyarrow.parquet as pq

    flyte.init()
    folder = Path(tempfile.mkdtemp(prefix="table-memory-"))
    path = folder / "questions.parquet"
    write_table(path, count)
    (done, failed), figures = peak_memory(lambda: run_job(path, folder / "out", args))
    assert (done, failed) == (count, 0), f"{done} rows of {count}, {failed} failed"
    assert pq.ParquetDataset(str(folder / "out")).read(columns=["id"]).num_rows == count
    return {"rows": count, **figures, "input_mib": path.stat().st_size / 2**20}


def main() -> None:
    parser = benchmark_parser(__doc__, time_scale=1000.0)
    parser.add_argument("--sizes", default="20000,200000", help="comma-separated row counts")
    parser.add_argument("--chunk-size", type=int, default=64, help="rows per chunk")
    parser.add_argument(
        "--max-chunks-in-flight", type=int, default=32, help="chunks in flight (0: the replicas' slots)"
    )
    parser.add_argument(
        "--via-runner", action="store_true", help="through flyte's local runner (it keeps every action)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument(
        "--allocators",
        choices=("driver", "default"),
        default="driver",
        help="driver: the allocator settings of the driver task's container (DRIVER_ALLOCATOR_ENV); default: glibc's "
        "and Arrow's own",
    )
    add_order_flags(parser)
    add_fresh_process_flag(parser)
    args = parser.parse_args()
    if args.allocators == "driver":  # read at a process's start: the sizes' fresh processes inherit them
        os.environ.update(DRIVER_ALLOCATOR_ENV)
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    rows = [in_fresh_process(__file__, int(size)) for size in args.sizes.split(",")]
    in_flight = args.max_chunks_in_flight or "the replicas' slots"
    how = "run_table through flyte's local runner" if args.via_runner else "the driver in this process"
    print(f"\nThe table job (simulated engine), chunks of {args.chunk_size}, {in_flight} in flight, ", end="")
    print(f"{order_words(args)}, {args.allocators} allocators")
    print(f"\n{memory_table(rows, 'rows')}")
    write_chart_data(
        args.chart_data,
        title="The table job's peak memory against the table's size",
        unit="peak RSS in MiB, each size in a fresh process",
        rows=[(f"{row['rows']:,} rows ({row['input_mib']:.1f} MiB)", row["peak_rss_mib"]) for row in rows],
        note=f"{how} on the simulated engine; chunks of {args.chunk_size}, {args.max_chunks_in_flight} in flight, "
        f"{order_words(args)} (benchmarks/bench_table_memory.py)",
        digits=0,
    )


if __name__ == "__main__":
    main()
