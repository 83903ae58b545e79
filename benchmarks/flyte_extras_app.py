"""flyte-sdk's batched-inference app pattern, for `bench_serve.py` to measure beside our server.

What `examples/ml/batch_inference_saturate_app.py` in flyte-sdk does: a FastAPI app holds a
`flyte.extras.TokenBatcher` (`target_batch_tokens=32_000`, `max_batch_size=256`,
`batch_timeout_s=0.05`, `max_queue_size=5_000`) whose `async def inference` calls the engine's
blocking `generate` (vLLM's `LLM.generate` there) directly, so the event loop is frozen for each
batch. Here the engine is the same simulated GPU as our server's, called the same blocking way:
its `generate` runs on a thread of its own and the event loop waits for it.

    BENCH_SIMULATED='{"time_scale": 2, "gpu": {"max_num_seqs": 64}}' uvicorn benchmarks.flyte_extras_app:app --port 8100

It answers `POST /v1/chat/completions` (`messages`, `max_tokens`) with the completion's text, and
`GET /stats` with its batcher's mean batch size and its engine's occupancy.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from flyteplugins_batcher.engines import Completion, GenerationConfig
from flyteplugins_batcher.engines import Request as EngineRequest
from flyteplugins_batcher.engines.simulated import SimulatedEngine


class BlockingEngine:
    """A simulated engine whose `generate` blocks its caller, as `vllm.LLM.generate` does."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.engine = SimulatedEngine(**options)
        self.engine.load()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="engine").start()

    def generate(self, records: list[EngineRequest]) -> list[Completion | Exception]:
        return asyncio.run_coroutine_threadsafe(self.engine.generate(records), self._loop).result()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    from flyte.extras import TokenBatcher

    llm = BlockingEngine(json.loads(os.environ.get("BENCH_SIMULATED", "{}")))

    async def inference(batch: list[EngineRequest]) -> list[Completion | Exception]:
        return llm.generate(batch)  # as the example does: the blocking call inside `async def`

    settings = {"target_batch_tokens": 32_000, "max_batch_size": 256, "batch_timeout_s": 0.05, "max_queue_size": 5_000}
    batcher = TokenBatcher(inference_fn=inference, **settings)
    await batcher.start()
    app.state.llm, app.state.batcher = llm, batcher
    yield
    await batcher.stop()


app = FastAPI(lifespan=lifespan)


@app.post("/v1/chat/completions")
async def chat(request: Request) -> dict[str, Any]:
    body = await request.json()
    record = EngineRequest(body["messages"], GenerationConfig(max_new_tokens=body.get("max_tokens", 256)))
    completion = await (await request.app.state.batcher.submit(record))
    return {"choices": [{"message": {"role": "assistant", "content": completion.text}}]}


@app.get("/stats")
async def stats(request: Request) -> dict[str, float]:
    engine = request.app.state.llm.engine.stats
    return {"avg_batch_size": request.app.state.batcher.stats.avg_batch_size, "occupancy": engine.occupancy or 0.0}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
