"""A replica process killed mid-job (SIGKILL): its chunks are retried on the others, nothing lost or duplicated.

Runs the benchmark harness small and fast: the real JSONL job and `fan_out`, two spawned replica
processes running the real `run_chunk` around the simulated engine, Flyte's queue and retries.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.scale_harness import questions_from, run_job, start_fleet, warm_up, write_requests
from flyteplugins_batcher.replica import EngineSettings

REQUESTS = 600


async def test_a_killed_replicas_chunks_finish_on_the_other_and_every_request_is_written_once(tmp_path: Path) -> None:
    options = {"time_scale": 40, "gpu": {"max_num_seqs": 16}, "output_lengths": {"mean": 40}}
    settings = EngineSettings(engine="simulated", engine_args=json.dumps(options), max_new_tokens=64)
    path = write_requests(tmp_path / "requests.jsonl", REQUESTS, questions_from(None), max_tokens=64)
    fleet = start_fleet(2)
    try:
        for replica in fleet:
            replica.listen()
        baseline = await warm_up(fleet, settings)
        run = await run_job(
            path,
            tmp_path,
            fleet,
            settings,
            baseline=baseline,
            chunk_size=4,
            concurrency=8,
            chunks_in_flight=16,
            latency_s=0.001,
            kill_at=0.3,
        )
    finally:
        for replica in fleet:
            replica.stop()

    assert run.kill is not None and run.kill.requests_lost > 0  # it died holding work
    assert fleet[run.kill.replica].process.exitcode == -9 and not fleet[run.kill.replica].alive
    assert run.retried >= run.kill.requests_lost // 4  # each of its chunks ran again elsewhere
    assert sorted(run.results) == [f"req-{number:06d}" for number in range(REQUESTS)]  # each once, none lost
    assert run.errors == 0
    _, survivor = run.snapshots[1 - run.kill.replica][-1]
    assert survivor.records > REQUESTS * 0.7  # it ran what it was given and what the dead one lost
