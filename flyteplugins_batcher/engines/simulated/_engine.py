"""SimulatedEngine: an engine that behaves, in time, like vLLM on a GPU, and computes nothing.

On a CPU, a model step costs about the same for 8 sequences as for 128, which hides the effect
that decides throughput on a GPU: there, decoding is memory-bound and a step of 256 sequences
costs little more than a step of 8, so a replica that keeps too few sequences in flight wastes
most of its GPU. This engine makes that visible without a GPU: it serves records exactly like
`VLLMStreamEngine` (each record its own request, scheduled by continuous batching), with a
`ContinuousBatchScheduler` for vLLM's scheduler and a thread that sleeps each step's modelled
duration for the GPU. Its completions are filler text of honest length; its statistics
(steps, occupancy, busy time) are what the benchmarks measure.

Its KV cache keeps computed prompt blocks as vLLM's automatic prefix caching does (on by default,
`SimulatedGpu(enable_prefix_caching=False)` turns it off): a prompt that starts like one computed
before skips those tokens' prefill, and its completion's `cached_tokens` says how many it skipped.

Like vLLM's stream mode, it streams (a `Request` with `on_delta` hears each step's new text) and
stops a record its caller cancels (`Request.cancellation`): the sequence leaves the scheduler
before the next step, and the record is answered with `RequestCancelledError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from flyteplugins_batcher import BatcherSettings
from flyteplugins_batcher.engines._base import (
    LoadedModel,
    Outcome,
    StreamingEngine,
    stream_batcher_settings,
    with_engine_options,
)
from flyteplugins_batcher.engines._completion import Completion, FinishReason, Sample, TokenLogprob
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._engine_errors import (
    EngineNotLoadedError,
    RequestCancelledError,
    UnsupportedSettingError,
)
from flyteplugins_batcher.engines._prompts import PreparedPrompt, PromptRecord
from flyteplugins_batcher.engines.simulated._continuous_batching import (
    OfflineRun,
    SequenceJob,
    StepResult,
    run_all_at_once,
)
from flyteplugins_batcher.engines.simulated._gpu import OutputLengths, SimulatedGpu
from flyteplugins_batcher.engines.simulated._gpu_thread import Served, SimulatedGpuThread, TokensListener
from flyteplugins_batcher.engines.simulated._prefix_cache import PrefixCacheStats, prefix_block_hashes
from flyteplugins_batcher.engines.simulated._tokenizer import CHARS_PER_TOKEN, SimulatedTokenizer, text_of_tokens


class SimulatedEngine(StreamingEngine):
    """An engine with vLLM's continuous batching and a GPU's step times, that sleeps instead of computing.

    Records go through the same pipeline as every engine (render, tokenize with a built-in
    4-characters-per-token tokenizer, check against the context, count), then each becomes one
    request to a simulated GPU. Each request generates `output_lengths.draw(...)` tokens,
    capped by its `max_new_tokens` (`finish_reason` `"length"` then, `"stop"` otherwise); stop
    strings and sampling settings change nothing else. Settings it cannot fake fail their record,
    naming the setting: a regex, choice or grammar, penalties, a logit bias. It honours the rest
    trivially: `logprobs` are 0.0 for each (certain) filler token, a LoRA adapter it was given
    (`lora_modules`, never read) changes nothing, a JSON format is not enforced.

    `stats` report engine `steps`, `occupancy` (running sequences per step over `max_num_seqs`)
    and `step_time_s`, the simulated GPU's busy time on its virtual clock: wall time is virtual
    time divided by `time_scale` (`lag_s` says whether the GPU thread ever fell behind its clock).
    With prefix caching on (`gpu.enable_prefix_caching`, vLLM's default), a prompt whose leading
    full blocks of `gpu.block_size` tokens are still cached skips their prefill, each completion
    reports them as `cached_tokens`, and `prefix_cache_stats` counts hits, misses and evictions.

    Args:
        gpu: The GPU and scheduler parameters; by default Llama-3-8B on one H100. A mapping
            of `SimulatedGpu` fields (as JSON engine arguments give them) works too.
        output_lengths: How long completions are (or a mapping of `OutputLengths` fields).
        time_scale: How much faster than real time the GPU runs: 10 makes a 7 ms step take 0.7 ms.
        **options: `generation`, `system_prompt`, `chat_template`, `model_name`, as for every
            `Engine`; records go through the built-in chat template unless `chat_template=False`.

    Example:
        ```python
        engine = SimulatedEngine(time_scale=10, output_lengths=OutputLengths(mean=200, long_fraction=0.05))
        engine.load()
        async with engine.batcher() as batcher:
            completions = await batcher.run(prompts)
        print(engine.stats.steps, engine.stats.occupancy, engine.ideal_run(prompts).makespan_s)
        engine.close()
        ```
    """

    name = "simulated"

    @with_engine_options
    def __init__(
        self,
        *,
        gpu: SimulatedGpu | Mapping[str, Any] | None = None,
        output_lengths: OutputLengths | Mapping[str, Any] | None = None,
        time_scale: float = 1.0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.gpu = gpu if isinstance(gpu, SimulatedGpu) else SimulatedGpu(**(gpu or {}))
        self.output_lengths = (
            output_lengths if isinstance(output_lengths, OutputLengths) else OutputLengths(**(output_lengths or {}))
        )
        self.time_scale = time_scale
        self._gpu_thread: SimulatedGpuThread | None = None

    @property
    def is_healthy(self) -> bool:
        """Whether the engine is loaded and its GPU thread runs."""
        gpu_thread = self._gpu_thread
        return self.is_loaded and gpu_thread is not None and gpu_thread.is_alive

    @property
    def lag_s(self) -> float:
        """The furthest (wall seconds) the GPU thread ever fell behind its clock: ~0 means timings are faithful."""
        return self._gpu_thread.lag_s if self._gpu_thread is not None else 0.0

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """What the prefix cache found, computed and evicted since `load()` (zeros while not loaded)."""
        return self._gpu_thread.prefix_cache_stats if self._gpu_thread is not None else PrefixCacheStats()

    @property
    def gpu_thread_cpu_s(self) -> float:
        """CPU seconds the GPU thread has used since `load()` (what simulating the GPU costs)."""
        return self._gpu_thread.cpu_s if self._gpu_thread is not None else 0.0

    def _load(self) -> LoadedModel:
        self._gpu_thread = SimulatedGpuThread(self.gpu, self.time_scale, self._record_step, name=f"{self.name}-gpu")
        self._counters.set_capacity(self.gpu.max_num_seqs)
        return LoadedModel(SimulatedTokenizer(), self.gpu.max_model_len)

    def _close(self) -> None:
        gpu_thread, self._gpu_thread = self._gpu_thread, None
        if gpu_thread is not None:
            gpu_thread.close()

    def _check_generation(self, generation: GenerationConfig) -> None:
        """Refuse, by name, what filler text cannot follow or show (see the class notes)."""
        refused = unsupported_settings(generation)
        if refused:
            raise UnsupportedSettingError(f"{', '.join(refused)} cannot be honoured by the {self.name} engine")

    def _record_step(self, result: StepResult) -> None:
        self._counters.count_step(result.running, result.step_s)

    async def _run(self, prompts: list[PreparedPrompt]) -> list[Outcome]:
        """Each prompt as its own requests (one per decoded sample), all submitted at once."""
        gpu_thread = self._gpu_thread
        if gpu_thread is None:
            raise EngineNotLoadedError(f"{self.name}: the engine is not loaded; call load() first")
        submitted = [(prompt, self._submit(gpu_thread, prompt)) for prompt in prompts]
        if len(submitted) == 1:  # stream mode's batches of one: skip gather's bookkeeping
            return [await self._outcome(*submitted[0])]
        return list(await asyncio.gather(*(self._outcome(prompt, futures) for prompt, futures in submitted)))

    def _submit(self, gpu_thread: SimulatedGpuThread, prompt: PreparedPrompt) -> list[asyncio.Future[Served]]:
        """A request per decoded sample of a prompt, each answering with its `Sample`."""
        tokens, finish_reason = self._output(prompt)
        text = text_of_tokens(tokens)
        sample = Sample(text, tokens, finish_reason, filler_logprobs(text, prompt.generation.logprobs))
        job = self._job(prompt, tokens)
        return [
            gpu_thread.submit(
                job, sample, on_tokens=_streamer(prompt, index, sample.text), cancellation=prompt.cancellation
            )
            for index in range(prompt.generation.decoded_samples)
        ]

    def _job(self, prompt: PreparedPrompt, output_tokens: int) -> SequenceJob:
        """The scheduler's view of one request: its lengths and, with prefix caching on, its prompt's block hashes."""
        gpu = self.gpu
        hashes = (
            prefix_block_hashes(prompt.token_ids, gpu.block_size, prompt.adapter) if gpu.enable_prefix_caching else ()
        )
        return SequenceJob(len(prompt.token_ids), output_tokens, block_hashes=hashes)

    async def _outcome(self, prompt: PreparedPrompt, futures: list[asyncio.Future[Served]]) -> Outcome:
        """The prompt's completion, or `RequestCancelledError` (with the tokens made) when its caller cancelled it.

        Its `cached_tokens` are its first request's (with several samples, the later ones find the prompt the
        first one computed).
        """
        answers: list[Served | BaseException]
        if len(futures) == 1:
            try:
                answers = [await futures[0]]
            except RequestCancelledError as stopped:
                answers = [stopped]
        else:
            answers = await asyncio.gather(*futures, return_exceptions=True)
        served = [answer for answer in answers if isinstance(answer, Served)]
        samples = [answer.outcome for answer in served]
        cancelled = [answer for answer in answers if isinstance(answer, RequestCancelledError)]
        failure = next((a for a in answers if isinstance(a, BaseException) and a not in cancelled), None)
        if failure is not None:
            raise failure
        if cancelled:
            made = sum(sample.completion_tokens for sample in samples) + sum(c.completion_tokens for c in cancelled)
            return RequestCancelledError(f"{self.name}: record {prompt.index} was cancelled", completion_tokens=made)
        if len(samples) < prompt.generation.n:  # greedy: one sample decoded, repeated
            samples *= prompt.generation.n
        return Completion.from_samples(len(prompt.token_ids), samples, cached_tokens=served[0].cached_tokens)

    def _output(self, prompt: PreparedPrompt) -> tuple[int, FinishReason]:
        """How many tokens a prompt generates, and why it stops there."""
        drawn = self.output_lengths.draw(prompt.token_ids, prompt.generation.seed)
        limit = prompt.generation.max_new_tokens
        return (drawn, "stop") if drawn <= limit else (limit, "length")

    def ideal_run(self, records: Sequence[PromptRecord]) -> OfflineRun:
        """The offline ideal for `records`: all given to this engine's model at once, as one `generate(all)`.

        Clock-free and fast (20,000 records in about a second); counts nothing in `stats`.
        Records that cannot run are left out, as `generate` would fail them.
        """
        prepared, _ = self._prepare(list(records))
        samples = (p for p in prepared for _ in range(p.generation.decoded_samples))
        return run_all_at_once((self._job(p, self._output(p)[0]) for p in samples), self.gpu)

    def batcher_defaults(self) -> BatcherSettings:
        """Stream mode's settings, from the simulated GPU's capacity (as `VLLMStreamEngine`'s)."""
        return stream_batcher_settings(self.gpu.max_num_seqs, self.gpu.kv_cache_tokens, self.gpu.max_model_len)


def unsupported_settings(generation: GenerationConfig) -> list[str]:
    """The settings of `generation` filler text cannot honour, named as a request names them."""
    refused = []
    response_format = generation.response_format
    if response_format is not None and not response_format.is_json:
        refused.append(f"structured_outputs.{response_format.kind}")
    refused += [name for name in ("presence_penalty", "frequency_penalty") if getattr(generation, name)]
    return refused + (["logit_bias"] if generation.logit_bias else [])


def filler_logprobs(text: str, top: int | None) -> tuple[TokenLogprob, ...] | None:
    """Logprobs for filler text (one token per 4 characters): each token certain (0.0), its only alternative itself."""
    if top is None:
        return None
    pieces = [text[start : start + CHARS_PER_TOKEN] for start in range(0, len(text), CHARS_PER_TOKEN)]
    return tuple(TokenLogprob(piece, 0.0, ((piece, 0.0),) if top else ()) for piece in pieces)


def _streamer(prompt: PreparedPrompt, sample: int, text: str) -> TokensListener | None:
    """Hands a streamed prompt's listener each step's new text of one sample (4 characters per token)."""
    if prompt.on_delta is None:
        return None
    logprobs = filler_logprobs(text, prompt.generation.logprobs) or ()

    def on_tokens(start: int, end: int) -> None:
        prompt.stream(sample, text[start * CHARS_PER_TOKEN : end * CHARS_PER_TOKEN], logprobs[start:end])

    return on_tokens
