"""The continuous-batching model: slots, the step's token budget, chunked prefill, the KV cache, step times.

Every expected figure is worked out by hand in the comments, from the rules in the module's notes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flyteplugins_batcher.engines import EngineStats
from flyteplugins_batcher.engines.simulated import OutputLengths, SimulatedGpu
from flyteplugins_batcher.engines.simulated._continuous_batching import (
    ContinuousBatchScheduler,
    SequenceJob,
    StepResult,
    run_all_at_once,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

TINY = SimulatedGpu(
    step_base_s=1.0,
    decode_seq_s=0.1,
    prefill_token_s=0.01,
    max_num_seqs=2,
    max_num_batched_tokens=10,
    kv_cache_tokens=1000,
    max_model_len=100,
)
"""Two slots, 10 tokens a step, round step times: every step below can be checked by hand."""


def shape(result: StepResult) -> tuple[int, int, int, list[str]]:
    return result.decode_seqs, result.prefill_tokens, result.running, [job.tag for job in result.finished]


def test_steps_follow_vllms_rules_slots_budget_chunked_prefill_and_leaving() -> None:
    scheduler = ContinuousBatchScheduler(TINY)
    for job in (SequenceJob(4, 3, "a"), SequenceJob(8, 1, "b"), SequenceJob(3, 2, "c")):
        scheduler.submit(job)

    steps = []
    while not scheduler.idle:
        steps.append(scheduler.step())

    assert [shape(step) for step in steps] == [
        (0, 10, 2, []),  # a's 4 prompt tokens (and its 1st token), then 6 of b's 8: the budget is spent
        (1, 2, 2, ["b"]),  # a decodes; b's last 2 prompt tokens; b wanted 1 token: it leaves. c: no free slot
        (1, 3, 2, ["a"]),  # a's 3rd token ends it; c is admitted and prefilled whole (its 1st token)
        (1, 0, 1, ["c"]),  # c's 2nd token
    ]
    assert [step.step_s for step in steps] == pytest.approx([1.1, 1.12, 1.13, 1.1])  # 1 + 0.1 * decodes + 0.01 * prompt
    assert scheduler.steps == 4 and scheduler.running_seqs == 7
    assert scheduler.virtual_time_s == pytest.approx(4.45)


def test_the_offline_run_adds_up_the_same_steps() -> None:
    run = run_all_at_once([SequenceJob(4, 3), SequenceJob(8, 1), SequenceJob(3, 2)], TINY)

    assert (run.steps, run.running_seqs, run.max_num_seqs) == (4, 7, 2)
    assert run.makespan_s == pytest.approx(4.45)
    assert run.occupancy == pytest.approx(7 / (4 * 2))


def test_the_offline_ideal_of_two_full_waves_matches_the_hand_computed_makespan() -> None:
    gpu = SimulatedGpu(max_num_batched_tokens=100_000)  # the defaults' step times, every prompt of a wave in one step

    run = run_all_at_once([SequenceJob(100, 10)] * 512, gpu)

    # A wave: one step prefills 256 x 100 tokens and samples each first token, 9 decode steps of 256 follow.
    # The second wave is admitted the step after the first leaves (its sequences hold their slots in their last step).
    wave_s = (0.007 + 0.00004 * 25_600) + 9 * (0.007 + 0.00007 * 256)
    assert run.steps == 20 and run.occupancy == 1.0
    assert run.makespan_s == pytest.approx(2 * wave_s)


def test_admission_waits_for_room_in_the_kv_cache() -> None:
    gpu = SimulatedGpu(max_num_seqs=8, max_num_batched_tokens=64, kv_cache_tokens=20, max_model_len=20, block_size=4)
    scheduler = ContinuousBatchScheduler(gpu)  # 5 blocks of 4 tokens
    scheduler.submit(SequenceJob(8, 4, "a"))  # 12 tokens at its end: 3 blocks
    scheduler.submit(SequenceJob(8, 4, "b"))  # 3 more would not fit beside a's

    running = []
    while not scheduler.idle:
        running.append(scheduler.step().running)

    assert running == [1, 1, 1, 1, 1, 1, 1, 1]  # b starts only once a left: 4 steps each, one at a time
    with pytest.raises(ValueError, match="cannot fit a KV cache of 20"):
        scheduler.submit(SequenceJob(16, 8))


def test_a_prompt_longer_than_the_budget_is_prefilled_over_several_steps_beside_the_decodes() -> None:
    gpu = SimulatedGpu(max_num_seqs=4, max_num_batched_tokens=16)
    scheduler = ContinuousBatchScheduler(gpu)
    scheduler.submit(SequenceJob(4, 10, "short"))
    scheduler.step()  # short is prefilled and decoding from here on
    scheduler.submit(SequenceJob(40, 2, "long"))

    prefills = [scheduler.step().prefill_tokens for _ in range(3)]

    assert prefills == [15, 15, 10]  # each step: 1 token for short's decode, the other 15 for long's prompt
    assert scheduler.running == 2


def test_an_idle_scheduler_has_nothing_to_step() -> None:
    with pytest.raises(RuntimeError, match="nothing to step"):
        ContinuousBatchScheduler(TINY).step()


def test_parameters_that_cannot_work_fail_at_construction() -> None:
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(128\) must be >= max_num_seqs \(256\)"):
        SimulatedGpu(max_num_batched_tokens=128)
    with pytest.raises(ValueError, match="must fit in the KV cache"):
        SimulatedGpu(kv_cache_tokens=4096)
    with pytest.raises(ValueError, match="spread"):
        OutputLengths(spread=1.5)


def test_occupancy_is_running_sequences_per_step_over_capacity_and_windows_subtract() -> None:
    before = EngineStats(steps=4, running_seqs=7, max_num_seqs=2, step_time_s=4.45, records=3)
    after = EngineStats(steps=10, running_seqs=19, max_num_seqs=2, step_time_s=10.0, records=9, load_time_s=2.0)

    window = after.since(before)

    assert before.occupancy == 7 / 8 and EngineStats(max_num_seqs=2).occupancy == 0.0
    assert EngineStats().occupancy is None  # no capacity: no continuous batching, no occupancy
    assert (window.steps, window.running_seqs, window.records, window.max_num_seqs) == (6, 12, 6, 2)
    assert window.occupancy == 1.0 and window.step_time_s == pytest.approx(5.55) and window.load_time_s == 2.0
    assert after.as_dict()["occupancy"] == 19 / 20


# -- output lengths --------------------------------------------------------------------------------------------


def test_output_lengths_follow_the_distribution_they_describe() -> None:
    lengths = OutputLengths(mean=200, spread=0.5, long_fraction=0.05, long_tokens=2000)

    draws = [lengths.draw([index, 7, 7]) for index in range(10_000)]
    ordinary = [draw for draw in draws if draw != 2000]

    assert 410 <= draws.count(2000) <= 590  # 5% of 10,000: 500, binomial sd 22, 4 sd either side
    assert min(ordinary) >= 100 and max(ordinary) <= 300
    assert 195 <= sum(ordinary) / len(ordinary) <= 205  # uniform on [100, 300]: sd of the mean 0.6
    assert {OutputLengths(spread=0.0).draw([index]) for index in range(100)} == {200}


def test_output_lengths_are_the_same_in_every_process_and_change_with_the_seeds() -> None:
    lengths = OutputLengths()
    here = [lengths.draw([index, 1, 2, 3]) for index in range(50)]
    code = (
        "from flyteplugins_batcher.engines.simulated import OutputLengths; "
        "print([OutputLengths().draw([index, 1, 2, 3]) for index in range(50)])"
    )

    there = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,  # this checkout's package, as here
        env={**os.environ, "PYTHONHASHSEED": "123"},  # str hashes differ from this process's
    ).stdout

    assert there.strip() == str(here)
    assert [OutputLengths(seed=1).draw([index, 1, 2, 3]) for index in range(50)] != here
    assert [lengths.draw([index, 1, 2, 3], sampling_seed=5) for index in range(50)] != here
