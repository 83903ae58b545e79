"""What every benchmark shares: where the repository and its data are, the common flags, rounds, producers, memory.

A benchmark runs as a script (`python benchmarks/bench_x.py`) or is imported (`benchmarks.bench_x`).
Run as a script, Python puts `benchmarks/` on the path, not the repository's root, so each script's
first statement after its standard imports puts the root there, and everything else comes from here:

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

    from benchmarks._harness import GSM8K, benchmark_parser

    args = benchmark_parser(__doc__, data=GSM8K, rounds=3, json=None).parse_args()

The contenders that are whole commands (our CLI beside vLLM's) have their own module, `_contenders.py`.
This module imports nothing of the package at import time, so that a benchmark can install its
virtual clock (`_virtual_clock.install`) before the batchers are imported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks._charts import add_chart_flag

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_GSM8K = REPO_ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
"""gsm8k's test split, beside the repository (1,319 questions)."""
SAMPLE_GSM8K = REPO_ROOT / "flyteplugins_batcher" / "jobs" / "data" / "gsm8k_sample.jsonl"
"""The package's own gsm8k sample (24 questions)."""
GSM8K = SHARED_GSM8K if SHARED_GSM8K.is_file() else SAMPLE_GSM8K
"""gsm8k's test split where it is, else the package's sample."""

T = TypeVar("T")
R = TypeVar("R")

COMMON_FLAGS: dict[str, dict[str, Any]] = {
    "data": {"type": Path, "help": "a gsm8k JSONL file (its questions)"},
    "rounds": {"type": int, "help": "rounds: every way runs once a round, in turn; each way's median is shown"},
    "json": {"type": Path, "help": "also write the rows here"},
    "quick": {"action": "store_true", "help": "small sizes, for a smoke run"},
    "threads": {"type": int, "help": "torch CPU threads"},
    "time_scale": {"type": float, "help": "the simulated GPU's speed-up over real time"},
    "model": {"help": "a hub id or path; none: the bundled SmolLM2-135M-Instruct"},
    "dtype": {"help": "float32: bf16 is emulated on AVX2-only CPUs"},
    "max_model_len": {"type": int, "help": "the engine's context, in tokens"},
    "max_num_seqs": {"type": int, "help": "the engine's sequences per step"},
    "kv_cache_gb": {"type": float, "help": "the engine's KV cache, in GiB"},
    "enforce_eager": {"action": argparse.BooleanOptionalAction, "help": "vLLM without CUDA graphs or compilation"},
}
"""The flags several benchmarks take, by their `args` name; each benchmark gives its own defaults."""

VLLM_ENGINE = dict(model="", dtype="float32", max_model_len=2048, max_num_seqs=256, kv_cache_gb=2.0, enforce_eager=True)
"""The engine flags every contender on vLLM takes, with their defaults (`benchmark_parser(__doc__, **VLLM_ENGINE)`)."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` with the docstring as written, and each flag's default after its help (where it has one)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # As argparse.ArgumentDefaultsHelpFormatter does, but silent on the defaults that say nothing.
        if not action.help or "%(default)" in action.help or action.default in (None, "", False, argparse.SUPPRESS):
            return action.help
        return f"{action.help} (default: %(default)s)"


def benchmark_parser(doc: str | None, *, chart: bool = True, **defaults: Any) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring as `--help`, the common flags named with their defaults, `--chart-data`.

    Example:
        ```python
        parser = benchmark_parser(__doc__, data=GSM8K, rounds=3)  # --data PATH, --rounds N (COMMON_FLAGS)
        parser.add_argument("--texts", type=int, default=1024)
        args = parser.parse_args()
        ```
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=HelpFormatter)
    for name, default in defaults.items():
        if name not in COMMON_FLAGS:
            raise ValueError(f"no common flag {name!r}; choose from {', '.join(COMMON_FLAGS)}")
        parser.add_argument(f"--{name.replace('_', '-')}", default=default, **COMMON_FLAGS[name])
    if chart:
        add_chart_flag(parser)
    return parser


def write_rows_json(path: Path | None, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Write a table's rows to `path` as JSON objects keyed by its headers (nothing when `path` is `None`)."""
    if path is not None:
        path.write_text(json.dumps([dict(zip(headers, row, strict=True)) for row in rows], indent=2, default=str))


# -- gsm8k --------------------------------------------------------------------------------------------


def gsm8k_rows(path: Path) -> list[dict[str, str]]:
    """Every row of a gsm8k JSONL file (`question`, `answer`)."""
    if not path.is_file():
        raise SystemExit(f"no gsm8k file at {path}; pass --data")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def gsm8k_questions(path: Path, count: int) -> list[str]:
    """The first `count` questions of a gsm8k JSONL file, repeated in order if it has fewer."""
    found = [row["question"] for row in gsm8k_rows(path)[:count]]
    if not found:
        raise SystemExit(f"{path} has no questions")
    return [found[number % len(found)] for number in range(count)]


# -- rounds -------------------------------------------------------------------------------------------


def round_order(number: int, ways: Sequence[T]) -> list[T]:
    """Forward in even rounds, backward in odd ones: each way's neighbours change from round to round."""
    return list(ways) if number % 2 == 0 else list(ways)[::-1]


def median_run(runs: Sequence[T], key: Callable[[T], float]) -> T:
    """The run in the middle by `key` (the upper one of an even count): a whole run, not a mix of several."""
    return sorted(runs, key=key)[len(runs) // 2]


def medians_by(runs: Sequence[T], group: Callable[[T], Any], value: Callable[[T], float]) -> dict[Any, float]:
    """The median of `value` per `group`, groups in the order they first come."""
    groups = dict.fromkeys(group(run) for run in runs)
    return {name: statistics.median(value(run) for run in runs if group(run) == name) for name in groups}


# -- producers ----------------------------------------------------------------------------------------


async def through_producers(
    submit: Callable[[T], Awaitable[Awaitable[R]]], items: Sequence[T], producers: int
) -> list[R]:
    """Deal `items` round-robin to concurrent producers; each submits all of its own, then awaits them.

    `submit(item)` hands an item to the batcher and returns what to await for its result (a batcher's
    `submit`; for a call that only returns its result, `asyncio.ensure_future(call(item))`). The
    results come back in the items' order.
    """

    async def produce(indices: range) -> list[tuple[int, R]]:
        futures = [await submit(items[index]) for index in indices]
        return list(zip(indices, await asyncio.gather(*futures), strict=True))

    shares = [range(producer, len(items), producers) for producer in range(producers)]
    by_index = dict(pair for pairs in await asyncio.gather(*(produce(share) for share in shares)) for pair in pairs)
    return [by_index[index] for index in range(len(items))]


# -- memory in a fresh process -------------------------------------------------------------------------

FRESH_FLAG = "--one"
"""The hidden flag a memory benchmark reruns itself with, to measure one size in a fresh process."""


def add_fresh_process_flag(parser: argparse.ArgumentParser) -> None:
    """Add the hidden `--one N`: measure size N in this process and print its figures as JSON."""
    parser.add_argument(FRESH_FLAG, type=int, help=argparse.SUPPRESS)


def add_order_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--order` and `--order-window` (`RunOptions.order`, `RunOptions.order_window`): how rows are placed."""
    from flyteplugins_batcher.jobs import RunOptions

    defaults = RunOptions()
    parser.add_argument(
        "--order", choices=("prefix", "file"), default=defaults.order, help="rows grouped by shared prefix, or not"
    )
    parser.add_argument(
        "--order-window", type=int, default=defaults.order_window, help="rows placed together in prefix order"
    )


def order_words(args: argparse.Namespace) -> str:
    """The placement a run used, in words: "prefix order (windows of 8,192 rows)" or "file order"."""
    return f"prefix order (windows of {args.order_window:,} rows)" if args.order == "prefix" else "file order"


def in_fresh_process(script: str, size: int) -> dict[str, float]:
    """Run `script` again with this run's flags and `--one size`, in a fresh process; the figures it printed last."""
    command = [sys.executable, str(Path(script).resolve()), *sys.argv[1:], FRESH_FLAG, str(size)]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    if finished.returncode != 0:
        raise SystemExit(f"{size:,} failed ({finished.returncode}):\n{finished.stderr[-4000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def peak_memory(run: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """`run()`'s result, and its seconds, the peak of its Python allocations and the process's peak RSS (MiB).

    The peak RSS is read as `run` returns, before the caller checks what it wrote.
    """
    tracemalloc.start()
    started = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - started
    _, python_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result, {"peak_rss_mib": peak_rss_mib, "python_peak_mib": python_peak / 2**20, "seconds": seconds}


def memory_table(rows: Sequence[dict[str, float]], unit: str) -> str:
    """Each size's input, peak RSS and peak Python allocations, and both peaks over the first size's."""
    from benchmarks._tables import markdown_table

    base = rows[0]
    cells = [
        [
            f"{row[unit]:,}",
            f"{row['input_mib']:.1f}",
            f"{row['peak_rss_mib']:.0f}",
            f"{row['peak_rss_mib'] / base['peak_rss_mib']:.2f}",
            f"{row['python_peak_mib']:.1f}",
            f"{row['python_peak_mib'] / base['python_peak_mib']:.2f}",
            f"{row['seconds']:.1f}",
        ]
        for row in rows
    ]
    headers = [unit, "input MiB", "peak RSS MiB", "x first", "peak Python allocations MiB", "x first", "seconds"]
    return markdown_table(headers, cells)
