"""Loading SmolLM2 from object storage: streamed, from the local folder, and downloaded first, side by side.

A real S3-compatible server on this machine (moto's, `benchmarks/_s3_server.py`) holds the bundled SmolLM2
(float32 safetensors, 538 MB). Each round loads the Transformers engine three ways, in turn, and times
`engine.load()` (tokenizer, model and grammar compiler: what a replica waits for before its first record):

- **local**: from the local folder (`from_pretrained`, the page cache warm);
- **streamed**: `--model s3://models/smollm2`: config and tokenizer into a fresh cache, weights streamed by Flyte's
  `load_hf_model` straight into the model;
- **download, then load**: the whole folder downloaded with Flyte's storage (`flyte.storage.get`), then loaded
  from disk, as a replica without streaming would.

The server is warmed once first (moto's first read of an object is its own cost, not a client's). Medians over
`--rounds`; goals: streamed at most 1.2x local, and less than download-then-load.

Run: `flock /tmp/bench.lock python benchmarks/bench_object_store.py --rounds 5` (`make bench-object-store`).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import benchmark_parser
from benchmarks._s3_server import S3Server
from flyteplugins_batcher.engines import GenerationConfig, bundled_smollm2_path, create_engine
from flyteplugins_batcher.engines._object_store import StoredModel

URI = "s3://models/smollm2"


def load_s(model: str) -> float:
    """`engine.load()`'s time for the Transformers engine on CPU (closed afterwards)."""
    engine = create_engine("transformers", model, generation=GenerationConfig(max_new_tokens=8), device="cpu")
    started = time.perf_counter()
    engine.load()
    took = time.perf_counter() - started
    engine.close()
    return took


def streamed_s(scratch: Path) -> float:
    os.environ["FLYTEPLUGINS_BATCHER_CACHE"] = str(Path(tempfile.mkdtemp(dir=scratch)))  # a fresh replica's cache
    return load_s(URI)


def downloaded_s(scratch: Path) -> float:
    folder = Path(tempfile.mkdtemp(dir=scratch)) / "smollm2"
    started = time.perf_counter()
    StoredModel(URI).download(folder)
    took = time.perf_counter() - started + load_s(str(folder))
    shutil.rmtree(folder.parent)
    return took


def main() -> None:
    args = benchmark_parser(__doc__, rounds=5).parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    local = str(bundled_smollm2_path())
    times: dict[str, list[float]] = {"local": [], "streamed": [], "download, then load": []}
    with S3Server.running() as server, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(server.environment())
        server.upload_folder(local, "models", "smollm2")
        streamed_s(Path(scratch))  # warms the server (and this process's imports) once
        load_s(local)
        for round_number in range(args.rounds):
            times["local"].append(load_s(local))
            times["streamed"].append(streamed_s(Path(scratch)))
            times["download, then load"].append(downloaded_s(Path(scratch)))
            took = ", ".join(f"{way} {values[-1]:.2f} s" for way, values in times.items())
            print(f"round {round_number + 1}: {took}")
    medians = {way: statistics.median(values) for way, values in times.items()}
    print("\n| way | load time (median) | vs local |\n|---|---|---|")
    for way, median in medians.items():
        print(f"| {way} | {median:.2f} s | {median / medians['local']:.2f}x |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    write_chart_data(
        args.chart_data,
        title="Loading SmolLM2 (538 MB, float32): from a local S3 server and from the local folder",
        unit=f"engine.load() in seconds, median of {args.rounds} rounds",
        rows=list(medians.items()),
        note="Transformers engine on CPU; moto's S3 server on this machine (benchmarks/bench_object_store.py).",
    )


if __name__ == "__main__":
    main()
