"""An online request beside a batch's lines waits for a slot of the engine, not behind every line in its queue.

The server's LLM batcher lets a self-scheduling engine (here the simulated GPU, 4 sequences at
once) hold its slots and a quarter more; the rest wait in the batcher, where an online request
(`ONLINE_PRIORITY`) goes first. Without that bound the batcher hands the engine up to 1,024
records, and the online request waits for all 40 lines ahead of it: about 10 generations instead
of about 2.
"""

from __future__ import annotations

import asyncio
import json
import time

from flyteplugins_batcher.engines import GenerationConfig, Request
from flyteplugins_batcher.replica import EngineSettings
from flyteplugins_batcher.server._admission import ONLINE_PRIORITY, engine_hold_keywords
from flyteplugins_batcher.server._inference import Inference

OPTIONS = {"time_scale": 0.5, "gpu": {"max_num_seqs": 4}, "output_lengths": {"mean": 32, "spread": 0}}


def request(text: str) -> Request:
    return Request([{"role": "user", "content": text}], GenerationConfig(max_new_tokens=64))


async def online_latency_beside_a_batch(lines: int) -> tuple[float, float, dict[str, object]]:
    inference = Inference(EngineSettings(engine="simulated", engine_args=json.dumps(OPTIONS)), embeddings=False)
    await inference.load()
    try:
        batcher = await inference.replica.shared.get(inference.engine_settings)
        started = time.perf_counter()
        await (await batcher.submit(request("alone"), priority=ONLINE_PRIORITY))
        idle = time.perf_counter() - started
        batch = [await batcher.submit(request(f"line {n}")) for n in range(lines)]
        await asyncio.sleep(0.05)  # the lines are in: the engine runs 4 of them
        started = time.perf_counter()
        await (await batcher.submit(request("online"), priority=ONLINE_PRIORITY))
        busy = time.perf_counter() - started
        await asyncio.gather(*batch)
        assert inference.engine is not None
        return idle, busy, engine_hold_keywords(inference.engine)
    finally:
        await inference.aclose()


def test_an_online_request_waits_for_a_slot_not_for_the_batch() -> None:
    idle, busy, hold = asyncio.run(online_latency_beside_a_batch(40))

    assert hold == {"max_concurrent_batches": 5}  # 4 running and 1 waiting in the engine
    assert busy / idle < 4  # about 2 generations (one to free a slot); behind the batch it is about 10


async def batcher_slo(settings: EngineSettings) -> object:
    inference = Inference(settings, embeddings=False)
    await inference.load()
    try:
        batcher = await inference.replica.shared.get(inference.engine_settings)
        return batcher.settings.latency_slo_s
    finally:
        await inference.aclose()


def test_an_engines_latency_target_is_the_online_requests_own_in_a_server() -> None:
    settings = EngineSettings(engine="simulated", engine_args=json.dumps(OPTIONS), latency_slo_s=0.5)

    assert settings.batcher_keywords()["latency_slo_s"] == 0.5  # a job's batcher: every record
    assert "latency_slo_s" not in EngineSettings(engine="simulated").batcher_keywords()
    assert asyncio.run(batcher_slo(settings)) == {ONLINE_PRIORITY: 0.5}  # batch lines have none
