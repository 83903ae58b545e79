"""A clock-free model of vLLM's continuous-batching scheduler, and the offline run it gives.

Each `step()` is one engine iteration, scheduled the way vLLM's (V1) scheduler does with chunked
prefill: every decoding sequence gets its one token first; the step's remaining token budget
(`max_num_batched_tokens`) then goes to prompts, first to the sequence whose prompt is part-way
through, then to waiting requests in arrival order, each admitted while a sequence slot
(`max_num_seqs`) and space in the KV cache remain. The KV cache is blocks with vLLM's automatic
prefix caching (`_prefix_cache.py`): a request admitted finds its prompt's longest cached prefix
there (a hit, even on blocks a request admitted earlier in the same step is computing, as in vLLM)
and computes only the rest, so it costs fewer prefill tokens and less of the budget. A prompt
longer than what is left of the budget is prefilled in chunks over several steps. The step that
finishes a prompt also samples the sequence's first token; each later step adds one more, and a
sequence leaves (freeing its slot and its blocks) in the step that produces its last token.

Deliberate simplifications, so the model stays exact and cheap:
- A sequence takes the blocks of its whole footprint (prompt + every token it will generate) when
  it is admitted, so nothing is ever preempted. vLLM takes blocks as tokens come and preempts when
  the cache fills, which packs a little tighter when the cache is the limit; with the default cache
  (over 1,700 tokens per slot) it rarely is.
- No speculative decoding, one sampled sequence per job (the engine submits a job per sample).

A job can leave before its end (`cancel`: its caller went away), as vLLM aborts a request: its
slot and its cache are free from the next step.

The scheduler never looks at a clock: it adds up the step times the `SimulatedGpu` gives, so the
same requests always produce the same steps and the same virtual time. `run_all_at_once` drives
it without any clock at all (the offline ideal); `SimulatedEngine` drives it in real time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from flyteplugins_batcher.engines.simulated._gpu import SimulatedGpu
from flyteplugins_batcher.engines.simulated._prefix_cache import PrefixCache, PrefixCacheStats


@dataclass(frozen=True, eq=False)
class SequenceJob:
    """One request as the scheduler sees it: tokens in, tokens out, and what its caller needs back.

    The scheduler tells jobs apart by identity: submit each request as its own object.

    Attributes:
        prompt_tokens: Prompt length (prefill work), >= 1.
        output_tokens: Tokens it will generate, >= 1.
        tag: Anything; handed back in `StepResult.finished`.
        block_hashes: The hash chain of its prompt's full blocks (`prefix_block_hashes`), what the prefix
            cache finds it by; empty for a prompt no other shares (or with prefix caching off).
    """

    prompt_tokens: int
    output_tokens: int
    tag: Any = None
    block_hashes: tuple[int, ...] = field(default=(), repr=False)

    @property
    def footprint(self) -> int:
        """KV-cache tokens it holds at its end: prompt + generated."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class StepResult:
    """What one engine step did.

    Attributes:
        index: The step's number, from 1.
        decode_seqs: Sequences that decoded one token.
        prefill_tokens: Prompt tokens computed (whole prompts and chunks), less those found in the prefix cache.
        running: Sequences holding a slot during the step (decoding and prefilling).
        step_s: The step's duration on the virtual clock.
        finished: The jobs whose last token this step produced.
        started: The jobs whose first token this step produced (their prompt was done).
        cached_tokens: For each job in `finished`, its prompt tokens found in the prefix cache.
    """

    index: int
    decode_seqs: int
    prefill_tokens: int
    running: int
    step_s: float
    finished: list[SequenceJob] = field(default_factory=list)
    started: list[SequenceJob] = field(default_factory=list)
    cached_tokens: dict[SequenceJob, int] = field(default_factory=dict)


@dataclass(frozen=True)
class OfflineRun:
    """The outcome of a job run start to end with every request known up front.

    Attributes:
        makespan_s: Virtual seconds from the first step to the last.
        steps: Engine steps taken.
        running_seqs: Running sequences summed over the steps.
        max_num_seqs: The engine's capacity.
        prefill_tokens: Prompt tokens computed, over the steps.
        prefix_cache: What the prefix cache found and evicted.
    """

    makespan_s: float
    steps: int
    running_seqs: int
    max_num_seqs: int
    prefill_tokens: int = 0
    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    @property
    def occupancy(self) -> float:
        """Mean running sequences per step, as a share of `max_num_seqs`."""
        return self.running_seqs / (self.steps * self.max_num_seqs) if self.steps else 0.0


class ContinuousBatchScheduler:
    """vLLM's continuous batching, without a clock: `submit` requests, `step()` the engine.

    Not thread-safe: one thread owns it.

    Args:
        gpu: Capacity, step timing, the KV cache's blocks and prefix caching.

    Attributes:
        cache: The KV cache's blocks (its `stats` say what prefix caching found).

    Example:
        ```python
        scheduler = ContinuousBatchScheduler(SimulatedGpu())
        scheduler.submit(SequenceJob(prompt_tokens=100, output_tokens=20))
        while not scheduler.idle:
            result = scheduler.step()
        print(scheduler.steps, scheduler.virtual_time_s)  # 20 steps, 20 step times
        ```
    """

    def __init__(self, gpu: SimulatedGpu) -> None:
        self.gpu = gpu
        self.cache = PrefixCache(gpu.kv_cache_tokens // gpu.block_size, gpu.block_size, gpu.enable_prefix_caching)
        self._waiting: deque[SequenceJob] = deque()
        self._prefilling: deque[list[Any]] = deque()  # [job, prompt tokens still to compute], in admission order
        self._decoding = 0
        self._finishing: dict[int, list[SequenceJob]] = {}  # step number -> jobs whose last token it makes
        self.steps = 0
        self.running_seqs = 0
        self.prefill_tokens = 0
        self.virtual_time_s = 0.0

    @property
    def waiting(self) -> int:
        """Requests not yet admitted."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Sequences holding a slot (prefilling or decoding)."""
        return self._decoding + len(self._prefilling)

    @property
    def idle(self) -> bool:
        """Whether there is nothing to step."""
        return not self._waiting and not self.running

    def submit(self, job: SequenceJob) -> None:
        """Queue a request; it is admitted at a later `step()`.

        Raises:
            ValueError: See `check`.
        """
        self.check(job)
        self._waiting.append(job)

    def check(self, job: SequenceJob) -> None:
        """Fail at once on a job that could never run (reads only the parameters: safe from any thread).

        Raises:
            ValueError: Its token counts are below 1, it could never fit the KV cache, or its block hashes
                are not one per full block of its prompt.
        """
        if job.prompt_tokens < 1 or job.output_tokens < 1:
            raise ValueError(f"a job needs >= 1 prompt and output token, got {job.prompt_tokens}, {job.output_tokens}")
        blocks, block_size = self.cache.blocks_for(job.footprint), self.gpu.block_size
        if blocks > self.cache.num_blocks:
            raise ValueError(
                f"a job of {job.footprint} tokens ({blocks} blocks of {block_size}) cannot fit a KV cache of "
                f"{self.gpu.kv_cache_tokens} tokens ({self.cache.num_blocks} blocks)"
            )
        if job.block_hashes and len(job.block_hashes) != job.prompt_tokens // block_size:
            raise ValueError(
                f"a prompt of {job.prompt_tokens} tokens has {job.prompt_tokens // block_size} full blocks of "
                f"{block_size}, got {len(job.block_hashes)} block hashes"
            )

    def unfinished(self) -> list[SequenceJob]:
        """Every job submitted and not finished (for failing them when the engine stops)."""
        jobs = list(self._waiting) + [entry[0] for entry in self._prefilling]
        return jobs + [job for jobs_then in self._finishing.values() for job in jobs_then]

    def step(self) -> StepResult:
        """Run one engine step (see the module notes for the rules).

        Raises:
            RuntimeError: The scheduler is idle.
        """
        if self.idle:
            raise RuntimeError("nothing to step: no request is waiting or running")
        self.steps += 1
        decode_seqs = self._decoding
        prefill_tokens, prefilled = self._schedule_prompts(self.gpu.max_num_batched_tokens - decode_seqs)
        running = decode_seqs + len(prefilled) + len(self._prefilling)
        finished = self._finishing.pop(self.steps, [])
        self._decoding -= len(finished)
        for job in prefilled:  # their prompt is done: this step samples their first token
            if job.output_tokens == 1:
                finished.append(job)
            else:
                self._finishing.setdefault(self.steps + job.output_tokens - 1, []).append(job)
                self._decoding += 1
        cached = {job: self.cache.release(job, job.output_tokens) for job in finished}
        step_s = self.gpu.step_time_s(decode_seqs, prefill_tokens)
        self.virtual_time_s += step_s
        self.running_seqs += running
        self.prefill_tokens += prefill_tokens
        return StepResult(self.steps, decode_seqs, prefill_tokens, running, step_s, finished, prefilled, cached)

    def cancel(self, job: SequenceJob) -> int | None:
        """Drop a job that has not finished: its slot and its KV cache are free from the next step.

        Returns:
            The tokens it had generated, or `None` when it is not here (finished, or never submitted).
        """
        if job in self._waiting:
            self._waiting.remove(job)
            return 0
        for entry in self._prefilling:
            if entry[0] is job:
                self._prefilling.remove(entry)
                self.cache.release(job, 0)
                return 0
        for last_step, jobs in self._finishing.items():
            if job in jobs:
                jobs.remove(job)
                if not jobs:
                    del self._finishing[last_step]
                self._decoding -= 1
                made = job.output_tokens - (last_step - self.steps)
                self.cache.release(job, made)
                return made
        return None

    def _schedule_prompts(self, budget: int) -> tuple[int, list[SequenceJob]]:
        """Spend `budget` tokens on prompts: the part-done ones, then new admissions. Returns (tokens, prompts done)."""
        spent, done = 0, []
        while self._prefilling and budget > spent:
            entry = self._prefilling[0]
            chunk = min(entry[1], budget - spent)
            spent += chunk
            entry[1] -= chunk
            self.cache.computed(entry[0], entry[0].prompt_tokens - entry[1])
            if entry[1]:
                break  # the budget ran out part-way through this prompt
            done.append(self._prefilling.popleft()[0])
        while self._waiting and budget > spent and self._has_slot(len(done)):
            job = self._waiting[0]
            cached = self.cache.admit(job, job.block_hashes, prompt_tokens=job.prompt_tokens, footprint=job.footprint)
            if cached is None:
                break  # no space in the KV cache: it waits, and those behind it too (first come, first served)
            self._waiting.popleft()
            to_compute = job.prompt_tokens - cached  # >= 1: the last prompt token is never a hit
            chunk = min(to_compute, budget - spent)
            spent += chunk
            self.cache.computed(job, cached + chunk)  # scheduled: a job admitted after it in this step finds them
            if chunk < to_compute:
                self._prefilling.append([job, to_compute - chunk])
            else:
                done.append(job)
        return spent, done

    def _has_slot(self, prefilled_now: int) -> bool:
        return self._decoding + prefilled_now + len(self._prefilling) < self.gpu.max_num_seqs


def run_all_at_once(jobs: Iterable[SequenceJob], gpu: SimulatedGpu) -> OfflineRun:
    """Run `jobs`, all submitted before the first step, to the end: the offline ideal (`LLM.generate(all)`).

    Example:
        ```python
        ideal = run_all_at_once([SequenceJob(120, 200)] * 2_000, SimulatedGpu())
        print(ideal.makespan_s, ideal.steps, ideal.occupancy)
        ```
    """
    scheduler = ContinuousBatchScheduler(gpu)
    for job in jobs:
        scheduler.submit(replace(job))  # its own object: the same job may be given several times
    while not scheduler.idle:
        scheduler.step()
    return OfflineRun(
        scheduler.virtual_time_s,
        scheduler.steps,
        scheduler.running_seqs,
        gpu.max_num_seqs,
        scheduler.prefill_tokens,
        scheduler.cache.stats,
    )
