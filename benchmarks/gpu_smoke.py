"""GPU smoke test and throughput benchmark: does the batcher keep the GPU busy?

Two comparisons over gsm8k questions, printed as markdown tables:

- (a) when vLLM is importable: `VLLMEngine` in batch mode vs stream mode, both fed by our `TokenBatcher`
  with the engine's own `batcher()` defaults;
- (b) always, on a CUDA machine: `TransformersEngine` called one record at a time vs fed by `TokenBatcher`.

Without `--model`, both use a randomly initialised Llama built from a config, with a byte-level BPE
tokenizer trained on the questions, so nothing is downloaded (GPU machines are often offline). Random
weights rarely produce EOS, so most completions run to `--max-new-tokens`: the numbers measure
throughput, not answer quality, and understate stream mode's gain (real completions vary in length,
which is what leaves batch mode waiting on each batch's longest answer).

Usage:
    python benchmarks/gpu_smoke.py --n 512 --max-new-tokens 128
    python benchmarks/gpu_smoke.py --model /models/SmolLM2-360M-Instruct --n 1319
    python benchmarks/gpu_smoke.py --device cpu --tiny --n 8 --max-new-tokens 8   # dry run without a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import inspect
import json
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._tables import markdown_table  # noqa: E402
from flyteplugins_batcher.engines._base import Completion, Engine, GenerationConfig  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
WARMUP_RECORDS = 8
UTILIZATION_PERIOD_S = 0.05


@dataclass(frozen=True)
class ModelShape:
    """Size of the random Llama used when no `--model` is given."""

    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    vocab_size: int

    def describe(self) -> str:
        return (
            f"random Llama, {self.layers} layers x {self.hidden_size} hidden, {self.heads} heads, "
            f"vocab {self.vocab_size}"
        )


GPU_SHAPE = ModelShape(hidden_size=1024, intermediate_size=2816, layers=12, heads=16, vocab_size=8192)
"""About 160M parameters: the scale of SmolLM2-135M/360M, small enough that batching decides throughput."""

TINY_SHAPE = ModelShape(hidden_size=64, intermediate_size=128, layers=2, heads=4, vocab_size=1024)


@dataclass(frozen=True)
class Row:
    """One measured configuration."""

    engine: str
    setup: str
    questions: int
    failed: int
    wall_s: float
    completion_tokens: int
    gpu_utilization: float | None

    @property
    def questions_per_s(self) -> float:
        return self.questions / self.wall_s if self.wall_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s else 0.0


class UtilizationSampler:
    """Mean GPU utilization (NVML, whole device) while the `with` block runs; `None` when unreadable.

    Reading the whole device counts vLLM's engine-core process too, which runs outside this one.
    """

    def __init__(self, device_index: int | None) -> None:
        self._device_index = device_index
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gpu-utilization", daemon=True)

    @property
    def mean(self) -> float | None:
        return sum(self._samples) / len(self._samples) if self._samples else None

    def __enter__(self) -> UtilizationSampler:
        if self._device_index is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _poll(self) -> None:
        import torch

        while not self._stop.wait(UTILIZATION_PERIOD_S):
            try:
                self._samples.append(float(torch.cuda.utilization(self._device_index)))
            except Exception:  # no NVML bindings: report "n/a" rather than fail the benchmark
                return


# -- inputs ------------------------------------------------------------------------------------


def load_questions(path: Path, n: int) -> list[str]:
    """The first `n` gsm8k questions."""
    if not path.is_file():
        raise SystemExit(f"gpu_smoke: no gsm8k data at {path}; pass --data PATH (a jsonl with a 'question' field)")
    with path.open(encoding="utf-8") as lines:
        questions = [json.loads(line)["question"] for line in lines if line.strip()]
    return questions[:n]


@contextlib.contextmanager
def random_model(shape: ModelShape, corpus: list[str], dtype: str) -> Iterator[Path]:
    """A randomly initialised Llama and a BPE tokenizer trained on `corpus`, in a temporary directory."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    # SmolLM2's ChatML layout, so that engines exercise their chat-template path.
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_model_") as directory:
        tokenizer.save_pretrained(directory)
        model.save_pretrained(directory)
        del model
        yield Path(directory)


# -- measuring ---------------------------------------------------------------------------------

Runner = Callable[[list[str]], Awaitable[list[Any]]]


def batched(engine: Engine, **overrides: Any) -> Runner:
    """Feed the records through `engine.batcher()` (the engine's own defaults plus `overrides`)."""

    async def run(prompts: list[str]) -> list[Any]:
        async with engine.batcher(**overrides) as batcher:
            return await batcher.run(prompts, return_exceptions=True)

    return run


def one_at_a_time(engine: Engine) -> Runner:
    """Call the engine with one record per call, each after the previous one finished."""

    async def run(prompts: list[str]) -> list[Any]:
        results: list[Any] = []
        for prompt in prompts:
            if inspect.iscoroutinefunction(engine.generate):
                results.extend(await engine.generate([prompt]))
            else:
                results.extend(await asyncio.to_thread(engine.generate, [prompt]))
        return results

    return run


async def measure(engine: Engine, setup: str, runner: Runner, prompts: list[str], device_index: int | None) -> Row:
    """Warm up on a few prompts, then time `runner` over all of them (one event loop for both)."""
    await runner(prompts[:WARMUP_RECORDS])
    with UtilizationSampler(device_index) as sampler:
        started = time.perf_counter()
        results = await runner(prompts)
        wall_s = time.perf_counter() - started
    completions = [result for result in results if isinstance(result, Completion)]
    return Row(
        engine=engine.name,
        setup=setup,
        questions=len(prompts),
        failed=len(results) - len(completions),
        wall_s=wall_s,
        completion_tokens=sum(completion.completion_tokens for completion in completions),
        gpu_utilization=sampler.mean,
    )


def vllm_rows(model: str, prompts: list[str], args: argparse.Namespace, device_index: int | None) -> list[Row]:
    """(a) vLLM batch mode vs stream mode, each through `TokenBatcher` with the engine's defaults."""
    from flyteplugins_batcher.engines._vllm import VLLMEngine

    rows = []
    for mode in ("batch", "stream"):
        engine = VLLMEngine(
            model,
            mode=mode,
            generation=GenerationConfig(max_new_tokens=args.max_new_tokens),
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
        )
        engine.load()
        try:
            print(f"vllm {mode} mode: TokenBatcher settings {engine.batcher_defaults()}")
            rows.append(asyncio.run(measure(engine, f"{mode} mode", batched(engine), prompts, device_index)))
        finally:
            engine.close()
    return rows


def transformers_rows(model: str, prompts: list[str], args: argparse.Namespace, device_index: int | None) -> list[Row]:
    """(b) Transformers one record at a time vs through `TokenBatcher`."""
    from flyteplugins_batcher.engines._transformers import TransformersEngine

    engine = TransformersEngine(
        model, device=args.device, dtype=args.dtype, generation=GenerationConfig(max_new_tokens=args.max_new_tokens)
    )
    engine.load()
    try:
        print(f"transformers: TokenBatcher settings {engine.batcher_defaults()}")
        sequential = prompts[: args.sequential_n]
        return [
            asyncio.run(measure(engine, "one at a time", one_at_a_time(engine), sequential, device_index)),
            asyncio.run(measure(engine, "TokenBatcher", batched(engine), prompts, device_index)),
        ]
    finally:
        engine.close()


def render_table(rows: list[Row]) -> str:
    headers = ["engine", "setup", "questions", "failed", "wall s", "questions/s", "completion tokens/s", "GPU util %"]
    return markdown_table(
        headers,
        [
            [
                row.engine,
                row.setup,
                row.questions,
                row.failed,
                row.wall_s,
                row.questions_per_s,
                round(row.tokens_per_s),
                "n/a" if row.gpu_utilization is None else round(row.gpu_utilization),
            ]
            for row in rows
        ],
    )


# -- entry point -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="gsm8k jsonl (default: %(default)s)")
    parser.add_argument("--n", type=int, default=512, help="questions to run (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", help="model id or directory; default: a random Llama built here")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (for dry runs)")
    parser.add_argument("--device", default="cuda", help="'cuda' (default), 'cuda:N', or 'cpu' for a dry run")
    parser.add_argument("--dtype", default=None, help="model dtype; default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--sequential-n", type=int, default=64, help="questions for the one-at-a-time baseline")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="vLLM's share of GPU memory")
    parser.add_argument("--max-model-len", type=int, default=2048, help="vLLM context length")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    return args


def cuda_device_index(device: str) -> int | None:
    """The CUDA device to use, or `None` for a CPU dry run; exits with a clear message when CUDA is missing."""
    if device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "gpu_smoke: no CUDA device is visible (torch.cuda.is_available() is False), so there is nothing to "
            "measure. Run it on a GPU machine, or pass --device cpu --tiny for a dry run of the script itself."
        )
    return torch.device(device).index or 0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device_index = cuda_device_index(args.device)
    prompts = load_questions(args.data, args.n)
    shape = TINY_SHAPE if args.tiny else GPU_SHAPE
    with contextlib.ExitStack() as stack:
        model = args.model or str(stack.enter_context(random_model(shape, prompts, args.dtype)))
        print(
            f"model: {args.model or shape.describe()}; {len(prompts)} questions; max_new_tokens={args.max_new_tokens}"
        )
        if args.skip_vllm:
            print("(a) vLLM: skipped (--skip-vllm)")
        elif importlib.util.find_spec("vllm") is None:
            print("(a) vLLM: not importable, skipped (pip install 'flyteplugins-batcher[vllm]')")
        else:
            rows = vllm_rows(model, prompts, args, device_index)
            print(f"\n(a) vLLM: batch mode vs stream mode\n\n{render_table(rows)}")
        if not args.skip_transformers:
            rows = transformers_rows(model, prompts, args, device_index)
            print(f"\n(b) Transformers: one at a time vs TokenBatcher\n\n{render_table(rows)}")


if __name__ == "__main__":
    main()
