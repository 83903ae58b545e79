"""`make run`'s inference on a busy CPU: the gsm8k job on the Transformers engine, with one core kept busy by another
process (as `make test-busy` does) against a quiet machine, taking turns.

Each run is a fresh process of the command line (`flyteplugins-batcher gsm8k --engine transformers`), as
`make run` is, and the figure is its summary line's `inference` (model loading excluded). With `--baseline
FOLDER` (another checkout, `main`'s say), the same runs are made with that checkout's package first on the path,
so that one table holds both; a run that passes `--timeout-s` is shown as more than it.

Run it under the machine's benchmark lock, and say the load:

    uptime; flock /tmp/bench.lock python benchmarks/bench_busy_cpu.py [--questions 8] [--rounds 2] [--baseline ../main]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: `benchmarks` imports

from benchmarks._charts import add_chart_flag, write_chart_data  # noqa: E402

INFERENCE = re.compile(r"\(inference ([\d.]+) s, model load")


@contextmanager
def one_core_busy(busy: bool) -> Iterator[None]:
    """Another process spinning on one core for the duration (`make test-busy`'s), or nothing."""
    if not busy:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def inference_s(package_root: Path, questions: int, max_new_tokens: int, timeout_s: float) -> float | None:
    """One run's inference seconds (its summary line's), or `None` when it ran past `timeout_s`."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "flyteplugins_batcher", "gsm8k", "--engine", "transformers"]
        command += ["--num-questions", str(questions), "--source", "sample", "--no-resume", "-o", folder]
        command += ["--max-new-tokens", str(max_new_tokens)]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=folder)
        except subprocess.TimeoutExpired:
            return None
    found = INFERENCE.search(done.stdout)
    if done.returncode or found is None:
        raise RuntimeError(f"the run failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=8, help="gsm8k questions per run (make run: 24)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="as make run's default")
    parser.add_argument("--rounds", type=int, default=2, help="quiet and busy runs of each package, taking turns")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure the same way (main's)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="a run past this is shown as more")
    add_chart_flag(parser)
    args = parser.parse_args()
    packages = {"this checkout": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    times: dict[tuple[str, bool], list[float | None]] = {}
    print(f"load before: {os.getloadavg()[0]:.2f}, CPUs: {len(os.sched_getaffinity(0))}", flush=True)
    for round_number in range(args.rounds):
        for name, root in packages.items():
            for busy in (False, True):
                started = time.monotonic()
                with one_core_busy(busy):
                    seconds = inference_s(root, args.questions, args.max_new_tokens, args.timeout_s)
                times.setdefault((name, busy), []).append(seconds)
                shown = f"{seconds:.1f} s" if seconds is not None else f"> {args.timeout_s:.0f} s"
                where = "one core busy" if busy else "quiet"
                print(
                    f"round {round_number + 1}: {name}, {where}: inference {shown} "
                    f"(run {time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print("\n| package | quiet (median s) | one core busy (median s) | busy / quiet |\n|---|---|---|---|")
    for name in packages:
        quiet, busy = (_median(times[(name, flag)], args.timeout_s) for flag in (False, True))
        print(f"| {name} | {quiet} | {busy} | {_ratio(times[(name, True)], times[(name, False)], args.timeout_s)} |")
    write_chart_data(
        args.chart_data,
        title=f"gsm8k on Transformers (SmolLM2), {args.questions} questions: inference with one core busy",
        unit=f"seconds of inference, lower is better (median of {args.rounds}; past {args.timeout_s:.0f} s: as that)",
        rows=[
            (f"{name}, {'one core busy' if busy else 'quiet'}", statistics.median(_capped(values, args.timeout_s)))
            for (name, busy), values in times.items()
        ],
        note="CPU, a process spinning on one core beside the run (benchmarks/bench_busy_cpu.py).",
        digits=1,
    )


def _capped(values: list[float | None], timeout_s: float) -> list[float]:
    return [timeout_s if value is None else value for value in values]


def _median(values: list[float | None], timeout_s: float) -> str:
    if any(value is None for value in values):
        return f"> {timeout_s:.0f}"
    return f"{statistics.median(values):.1f}"  # type: ignore[type-var]


def _ratio(busy: list[float | None], quiet: list[float | None], timeout_s: float) -> str:
    if any(value is None for value in quiet):
        return "n/a"
    quiet_s = statistics.median(quiet)  # type: ignore[type-var]
    if any(value is None for value in busy):
        return f"> {timeout_s / quiet_s:.1f}x"
    return f"{statistics.median(busy) / quiet_s:.2f}x"  # type: ignore[type-var]


if __name__ == "__main__":
    main()
