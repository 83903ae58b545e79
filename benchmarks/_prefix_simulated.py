"""bench_prefix.py's cluster part: documents x questions on R replica processes of the GPU-timed simulated engine.

The real JSONL driver (`scale_harness.run_job`: `Job`'s chunks through `fan_out`, a router that
queues calls as Flyte does) sends the file to R = 1, 2, 4, 8 replica processes, each a real
`LLMReplica` around `SimulatedEngine` (vLLM's continuous batching with an 8B model's step times on
an H100, and its prefix cache, whose KV holds `kv_cache_tokens`), once in "prefix" order and once in
"file" order. Each answer's `usage.prompt_tokens_details.cached_tokens` says what its replica found
cached; prefill computed is the prompt tokens less those. The ideal computes each document once:
every line's prompt through one engine with a cache that holds everything, in sorted order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.scale_harness import engine_requests, run_job, start_fleet, warm_up
from flyteplugins_batcher import size_in_flight
from flyteplugins_batcher.engines.simulated import SimulatedEngine, SimulatedGpu
from flyteplugins_batcher.replica import EngineSettings


def settings(gpu: SimulatedGpu, max_tokens: int, time_scale: float) -> EngineSettings:
    options = {"time_scale": time_scale, "gpu": dataclasses.asdict(gpu)}
    return EngineSettings(engine="simulated", engine_args=json.dumps(options), max_new_tokens=max_tokens)


def ideal_prefill(path: Path, gpu: SimulatedGpu, max_tokens: int) -> int:
    """The prefill tokens if each shared prefix were computed once: the lines sorted, a cache that holds them all."""
    roomy = dataclasses.replace(gpu, kv_cache_tokens=10**9)
    engine = SimulatedEngine(gpu=roomy)
    with engine:
        requests = engine_requests(path, settings(roomy, max_tokens, 1.0))
        requests.sort(key=lambda request: request.prefix_key() or "")
        return engine.ideal_run(requests).prefill_tokens


def computed(results: Path) -> tuple[int, int]:
    """(prompt tokens, prompt tokens computed) over the answers in a results file."""
    prompt = cached = 0
    for line in results.open(encoding="utf-8"):
        usage = json.loads(line)["response"]["body"]["usage"]
        prompt += usage["prompt_tokens"]
        cached += usage["prompt_tokens_details"]["cached_tokens"]
    return prompt, prompt - cached


async def one_run(path: Path, replicas: int, order: str, gpu: SimulatedGpu, args: Any) -> dict[str, Any]:
    """The file on `replicas` fresh replica processes in `order`; its prefill computed and wall time."""
    fleet = start_fleet(replicas)
    for replica in fleet:
        replica.listen()
    try:
        engine = settings(gpu, args.max_tokens, args.time_scale)
        baseline = await warm_up(fleet, engine)
        sized = size_in_flight(gpu.max_num_seqs, replicas)
        folder = Path(tempfile.mkdtemp(prefix=f"bench-prefix-r{replicas}-{order}-"))
        run = await run_job(
            path, folder, fleet, engine, baseline=baseline, chunk_size=sized.chunk_size,
            concurrency=sized.concurrency, chunks_in_flight=sized.chunks_in_flight, latency_s=0.0, order=order,
        )  # fmt: skip
        prompt, prefill = computed(folder / "results.jsonl")
        return {"replicas": replicas, "order": order, "prompt": prompt, "prefill": prefill, "wall_s": run.wall_s}
    finally:
        for replica in fleet:
            replica.stop()


def measure(path: Path, args: Any) -> tuple[int, list[dict[str, Any]]]:
    """The ideal, and every (replicas, order) run."""
    gpu = SimulatedGpu(kv_cache_tokens=args.sim_kv_cache_tokens)
    ideal = ideal_prefill(path, gpu, args.max_tokens)
    runs = [
        asyncio.run(one_run(path, replicas, order, gpu, args))
        for replicas in args.sim_replicas
        for order in ("prefix", "file")
    ]
    return ideal, runs
