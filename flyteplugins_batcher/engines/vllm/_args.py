"""vLLM engine arguments: checked before the minute-long start-up, with defaults that fit the machine.

On a machine without CUDA (vLLM's CPU build), vLLM's defaults do not fit: `gpu_memory_utilization`
means the fraction of *host* memory given to the KV cache there, and its 0.92 fails next to
anything else running; and vLLM computes in bfloat16, which CPUs without bf16 instructions
(AVX512-BF16 or AMX) emulate slowly: SmolLM2 answered 5.6x faster in float32 on an AVX2-only EPYC.
So on CPU we reserve a fixed KV cache (`kv_cache_memory_bytes`, at most 2 GiB and a quarter of the
available memory), skip graph compilation (`enforce_eager`), and use float32 unless the CPU has
bf16 instructions, unless the user says otherwise. On a GPU, vLLM's own defaults apply.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
from collections.abc import Mapping
from typing import Any

from flyteplugins_batcher.engines._engine_errors import EngineConfigError, parse_json_object

CPU_KV_CACHE_CAP_BYTES = 2 << 30
"""At most this much host memory for the KV cache by default on CPU (enough for ~90k SmolLM2 tokens)."""

CPU_KV_CACHE_SHARE = 0.25
"""At most this share of the available host memory for the KV cache by default on CPU."""


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (vLLM's GPU build runs); without torch, no."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def available_memory_bytes() -> int | None:
    """Host memory available for new allocations (Linux `MemAvailable`), or `None` where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_has_bf16() -> bool:
    """Whether the CPU computes bfloat16 natively (AVX512-BF16 or AMX), as Linux reports it."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        return False
    return False


def with_device_defaults(engine_args: Mapping[str, Any], *, on_cpu: bool) -> dict[str, Any]:
    """`engine_args` plus the defaults that let vLLM start on this machine (see the module notes)."""
    args = dict(engine_args)
    if not on_cpu:
        return args
    args.setdefault("enforce_eager", True)
    if not cpu_has_bf16():
        args.setdefault("dtype", "float32")
    if "kv_cache_memory_bytes" not in args and "gpu_memory_utilization" not in args:
        available = available_memory_bytes()
        share = int(available * CPU_KV_CACHE_SHARE) if available else CPU_KV_CACHE_CAP_BYTES
        args["kv_cache_memory_bytes"] = min(CPU_KV_CACHE_CAP_BYTES, share)
    return args


COMPACT_JSON: dict[str, Any] = {"backend": "xgrammar", "disable_any_whitespace": True}
"""vLLM's structured outputs (`structured_outputs_config`) unless the engine arguments give their own: JSON
generated without free whitespace (`disable_any_whitespace`: `{"a":1,"b":[2,3]}`, no newline, indent or space
between its tokens), by xgrammar, the grammar compiler every response format is checked with here. Small models
given free whitespace spend their budget on newlines and indentation; compact JSON parses the same, in fewer
tokens (`benchmarks/bench_compact_json.py`)."""


def with_compact_json(engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """`engine_args` with structured output generated without free whitespace (`COMPACT_JSON`), unless they
    configure structured outputs themselves (`structured_outputs_config`, a JSON object or vLLM's config).

    With compact JSON, `ForcedTokens` writes the text the grammar forces in the tokenizer's own tokens (vLLM
    refuses custom logits processors beside speculative decoding: there it is left out).
    """
    from vllm.config import StructuredOutputsConfig

    args = dict(engine_args)
    given = args.get("structured_outputs_config", COMPACT_JSON)
    args["structured_outputs_config"] = StructuredOutputsConfig(**given) if isinstance(given, Mapping) else given
    if "structured_outputs_config" not in engine_args and not args.get("speculative_config"):
        from flyteplugins_batcher.engines.vllm._forced_tokens import ForcedTokens

        args["logits_processors"] = [*(args.get("logits_processors") or []), ForcedTokens]
    return args


def check_engine_args(engine_args: Mapping[str, Any], accepted: set[str], *, on_cpu: bool) -> None:
    """Fail at once on an argument vLLM does not know, or a KV cache that cannot fit in host memory.

    Raises:
        EngineConfigError: Naming the argument (and the closest valid one), or the memory shortfall.
    """
    for name in engine_args:
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise EngineConfigError(f"vllm: unknown engine argument {name!r}{hint}")
    kv_bytes = engine_args.get("kv_cache_memory_bytes")
    available = available_memory_bytes()
    if on_cpu and isinstance(kv_bytes, int) and available is not None and kv_bytes > available:
        raise EngineConfigError(
            f"vllm: kv_cache_memory_bytes={kv_bytes} ({kv_bytes / 2**30:.1f} GiB) does not fit in the "
            f"{available / 2**30:.1f} GiB of host memory available; lower it (the KV cache lives in host "
            "memory on CPU)"
        )
    fraction = engine_args.get("gpu_memory_utilization")
    if on_cpu and isinstance(fraction, (int, float)) and fraction > 0.85:
        raise EngineConfigError(
            f"vllm: gpu_memory_utilization={fraction} on CPU asks for {fraction:.0%} of host memory for the KV "
            "cache, which does not fit beside the process itself; use 0.5 or less, or kv_cache_memory_bytes"
        )


def accepted_arguments(vllm_module: Any, *, streaming: bool) -> set[str]:
    """The keyword arguments `vllm.LLM` (batch) or `AsyncEngineArgs` (stream) accept."""
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

    accepted = {field.name for field in dataclasses.fields(AsyncEngineArgs if streaming else EngineArgs)}
    if not streaming:
        accepted |= set(inspect.signature(vllm_module.LLM.__init__).parameters) - {"self", "kwargs"}
    return accepted - {"model"}


def parse_engine_args(text: str) -> dict[str, Any]:
    """Engine arguments from a JSON object (for command lines and workflow inputs); `""` is none.

    Raises:
        EngineConfigError: It is not a JSON object.
    """
    if not text.strip():
        return {}
    try:
        return parse_json_object(text, "vllm engine arguments")
    except ValueError as error:
        raise EngineConfigError(str(error)) from None


def running_on_cpu() -> bool:
    """Whether vLLM will run on the CPU here (no CUDA device, or `VLLM_TARGET_DEVICE=cpu`)."""
    return os.environ.get("VLLM_TARGET_DEVICE") == "cpu" or not cuda_available()
