"""The simulated GPU's parameters (`SimulatedGpu`) and the output lengths it generates (`OutputLengths`).

Defaults model Llama-3-8B in bfloat16 on one 80 GB H100 under vLLM. Where each figure comes from:

- Step time `t0 + a * decode_seqs + b * prefill_tokens`, with `t0 = 7 ms`, `a = 0.07 ms` per decoding
  sequence and `b = 0.04 ms` per prefill token. A decode step streams the 16 GB of weights once
  (about 5 ms at the H100's 3.35 TB/s) plus fixed launch and sampling costs: `t0`. Each decoding
  sequence adds its KV-cache reads and a row of matmuls: `a`, small, which is why a step of 256
  sequences costs only about 3.5x a step of 1. Prefill is compute-bound: 2 x 8e9 FLOPs per token
  at about 40% of the H100's ~1,000 dense bf16 TFLOPs is about 0.04 ms per token: `b`.
- `max_num_seqs = 256`: vLLM's long-standing default, and the figure issue 15 sizes against
  (vLLM 0.32 raises its own default to 1024 on GPUs with >= 70 GiB, see below).
- `max_num_batched_tokens = 8192`: vLLM 0.32 `EngineArgs.get_batch_defaults`
  (`vllm/engine/arg_utils.py`) gives GPUs with >= 70 GiB that are not A100s (H100, H200)
  16384 for the offline `LLM` class and 8192 for the OpenAI server; requests that arrive over
  time, as in stream mode, are the server's case.
- `kv_cache_tokens = 442_368`: a token of Llama-3-8B's KV cache holds K and V (2) x 32 layers x
  8 KV heads x 128 dims x 2 bytes = 131,072 bytes = 128 KiB. vLLM's default
  `gpu_memory_utilization = 0.9` of the H100's 79.6 GiB is 71.7 GiB; minus 15 GiB of weights and
  about 2.7 GiB of activations and CUDA graphs leaves 54 GiB for the cache: 54 GiB / 128 KiB =
  442,368 tokens (vLLM reports "GPU KV cache size" in this range for this model and GPU).
- `max_model_len = 8192`: Llama-3-8B's context.
- `block_size = 16`: vLLM's default KV-cache block (`CacheConfig.DEFAULT_BLOCK_SIZE`,
  `vllm/config/cache.py`), so the default cache is 442,368 / 16 = 27,648 blocks; a sequence holds
  whole blocks (a 17-token sequence holds 2).
- `enable_prefix_caching = True`: vLLM's default (`CacheConfig.enable_prefix_caching`): prompts that
  start with the same full blocks as a prompt computed before, and still cached, skip computing
  them (their prefill tokens leave the step's time); the rules are in `_prefix_cache.py`.

Calibrating against a real GPU run: start vLLM with `disable_log_stats=False` and run N identical
requests with long outputs at once (N = 1, 8, 32, 128, 256; `ignore_eos=True`, `max_tokens=512`,
short prompts). Each run's decode-step time is its wall time over its engine steps (the count of
vLLM's `vllm:iteration_tokens_total` histogram), or the median of `vllm:inter_token_latency_seconds`;
a straight-line fit of step time against N gives `t0` (intercept) and `a` (slope). Then run
prompts of 4,000 tokens with `max_tokens=1`: step time minus `t0`, over the tokens per step
(`vllm:iteration_tokens_total`'s sum over its count), gives `b`. vLLM logs `max_num_seqs`,
`max_num_batched_tokens` and "GPU KV cache size: N tokens" at start-up: copy them.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SimulatedGpu:
    """What the simulated engine models: a vLLM engine's capacity and the time its steps take.

    Attributes:
        step_base_s: `t0`, seconds every engine step costs, whatever it computes.
        decode_seq_s: `a`, seconds each decoding sequence adds to a step.
        prefill_token_s: `b`, seconds each prefill (prompt) token adds to a step.
        max_num_seqs: Sequences that can run at once (vLLM's `max_num_seqs`).
        max_num_batched_tokens: Tokens one step may compute: one per decoding sequence, the rest
            for prompt chunks (vLLM's `max_num_batched_tokens`, chunked prefill on).
        kv_cache_tokens: Tokens the KV cache holds across all running sequences (and cached prefixes).
        max_model_len: Longest sequence (prompt + generated tokens) one request may have.
        block_size: Tokens per KV-cache block: the cache is `kv_cache_tokens // block_size` blocks, a
            sequence holds whole blocks, and prefix caching finds prompts' full blocks (vLLM's `block_size`).
        enable_prefix_caching: Whether prompts reuse cached full blocks of earlier prompts (vLLM's
            automatic prefix caching, `enable_prefix_caching`); off, every prompt token is computed.
        label: Names the model in reports.

    Example:
        ```python
        gpu = SimulatedGpu(max_num_seqs=128)
        gpu.step_time_s(decode_seqs=128, prefill_tokens=0)  # 7 ms + 128 x 0.07 ms = 15.96 ms
        ```
    """

    # one step's time: step_base_s + decode_seq_s x decoding sequences + prefill_token_s x prefill tokens
    step_base_s: float = 0.007
    decode_seq_s: float = 0.000_07
    prefill_token_s: float = 0.000_04
    # the engine's capacity, as vLLM's settings of the same names bound it
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_cache_tokens: int = 442_368
    max_model_len: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = True
    label: str = "Llama-3-8B bf16 on 1x H100 80GB"

    def __post_init__(self) -> None:
        for name in ("step_base_s", "decode_seq_s", "prefill_token_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens", "max_model_len", "block_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:  # vLLM refuses this too: a step must fit every decode
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be true or false, got {self.enable_prefix_caching!r}")
        blocks = self.kv_cache_tokens // self.block_size
        if -(-self.max_model_len // self.block_size) > blocks:  # as vLLM checks at start-up, in whole blocks
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must fit in the KV cache ({self.kv_cache_tokens} tokens: "
                f"{blocks} blocks of {self.block_size})"
            )

    def step_time_s(self, decode_seqs: int, prefill_tokens: int) -> float:
        """Seconds one engine step takes: `t0 + a * decode_seqs + b * prefill_tokens`."""
        return self.step_base_s + self.decode_seq_s * decode_seqs + self.prefill_token_s * prefill_tokens

    def describe(self) -> str:
        """One line for reports: the model and every parameter."""
        return (
            f"{self.label}: step = {self.step_base_s * 1e3:g} ms + {self.decode_seq_s * 1e3:g} ms/decoding seq "
            f"+ {self.prefill_token_s * 1e3:g} ms/prefill token; max_num_seqs={self.max_num_seqs}, "
            f"max_num_batched_tokens={self.max_num_batched_tokens}, KV cache {self.kv_cache_tokens:,} tokens "
            f"in blocks of {self.block_size}, prefix caching {'on' if self.enable_prefix_caching else 'off'}"
        )


@dataclass(frozen=True)
class OutputLengths:
    """How many tokens each request generates before it stops on its own (EOS or a stop string).

    Most requests draw uniformly from `mean * (1 - spread)` to `mean * (1 + spread)`; a
    `long_fraction` share generates `long_tokens` instead. The draw is a hash of the request's
    prompt token ids, this `seed` and the request's sampling seed, so the same request gets the
    same length in every run and every process. A request's `max_new_tokens` caps it (then it
    finishes with `"length"`, else with `"stop"`).

    Attributes:
        mean: Mean length of the ordinary requests, in tokens.
        spread: Half-width of their uniform range, as a share of `mean` (0 makes every one `mean`).
        long_fraction: Share of requests that generate `long_tokens` (0.05 for a 5% long tail).
        long_tokens: Length of the long ones.
        seed: Changes every draw at once.

    Example:
        ```python
        lengths = OutputLengths(mean=200, spread=0.5, long_fraction=0.05, long_tokens=2000)
        tokens = lengths.draw([1, 2, 3])  # the same on every call and in every process
        ```
    """

    mean: int = 200
    spread: float = 0.5
    # the long tail: requests that generate far more than the rest (and pin their chunk's call)
    long_fraction: float = 0.0
    long_tokens: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.mean, int) or self.mean < 1:
            raise ValueError(f"mean must be an integer >= 1, got {self.mean!r}")
        if not 0 <= self.spread < 1:
            raise ValueError(f"spread must be in [0, 1), got {self.spread}")
        if not 0 <= self.long_fraction <= 1:
            raise ValueError(f"long_fraction must be in [0, 1], got {self.long_fraction}")
        if not isinstance(self.long_tokens, int) or self.long_tokens < 1:
            raise ValueError(f"long_tokens must be an integer >= 1, got {self.long_tokens!r}")

    def draw(self, token_ids: Sequence[int], sampling_seed: int | None = None) -> int:
        """The number of tokens a request with these prompt token ids generates, uncapped (>= 1)."""
        digest = hashlib.blake2b(
            array("q", token_ids).tobytes(), digest_size=16, key=f"{self.seed}/{sampling_seed}".encode()
        ).digest()
        long_draw = int.from_bytes(digest[:8], "little") / 2**64
        if long_draw < self.long_fraction:
            return self.long_tokens
        uniform = int.from_bytes(digest[8:], "little") / 2**64
        return max(1, round(self.mean * (1 + self.spread * (2 * uniform - 1))))
