"""Calibrate the GPU-timed engine: how long one engine step takes on a real GPU, by batch and by prefill size.

The simulated engine (`flyteplugins_batcher.engines.SimulatedEngine`) prices a step as
`t0 + a * decode_seqs + b * prefill_tokens`. This script measures those three numbers on the GPU at
hand, for a model of a chosen shape with random weights (no download: the step time of a dense
transformer depends on its shapes, not on its weights), in bf16 with a static KV cache:

- decode: one new token for each of B sequences that already hold `context` tokens, for several B;
  the step is captured in a CUDA graph and replayed, as vLLM does, so launch overhead stays out;
- prefill: one forward pass over T prompt tokens, for several T.

It fits `t0` and `a` to the decode times by least squares and `b` to the prefill times, prints a
table and writes JSON. Needs only torch and transformers, and a CUDA GPU:

    python benchmarks/gpu_step_time.py --json step_time.json            # Llama-3-8B shapes
    python benchmarks/gpu_step_time.py --layers 2 --batches 1,8 --quick  # a smoke run

vLLM's kernels (paged attention, fused MoE-free MLPs, its own CUDA graphs) are at least as fast as
these, so the fitted numbers are an upper bound on vLLM's step cost for the same shapes.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._harness import benchmark_parser
from benchmarks._tables import markdown_table

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}


@dataclass
class Measurement:
    """One timed configuration."""

    kind: str  # "decode" or "prefill"
    batch: int  # sequences in the step (decode) or 1 (prefill)
    tokens: int  # context per sequence (decode) or prompt tokens (prefill)
    ms: float  # median step time
    graph: bool  # replayed from a CUDA graph


def build_model(layers: int, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers}, attn_implementation="sdpa")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # build the weights in bf16 directly (8B in fp32 would be 32 GB)
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    return config, model


def _median_ms(run, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def time_decode(config, model, batch: int, context: int, repeats: int, device: str) -> Measurement:
    """One decode step for `batch` sequences of `context` tokens each (graph-replayed on CUDA)."""
    from transformers import StaticCache

    # A static cache attends over all of its positions whatever they hold, so one token per sequence
    # sizes it: the step below then reads `context` positions per sequence, as a full cache would.
    cache = StaticCache(config=config, max_cache_len=context + 1)
    first = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    model(input_ids=first, past_key_values=cache, cache_position=torch.zeros(1, dtype=torch.long, device=device))
    step_ids = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    position = torch.tensor([context], device=device)

    def step() -> None:
        model(input_ids=step_ids, past_key_values=cache, cache_position=position)

    graph = None
    if device == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
        except Exception as error:  # some attention paths cannot be captured: time eager steps instead
            print(f"  (no CUDA graph for batch {batch}: {type(error).__name__}: {error})")
            graph = None
    run = graph.replay if graph is not None else step
    for _ in range(3):
        run()
    ms = _median_ms(run, repeats, device)
    return Measurement("decode", batch, context, ms, graph is not None)


@torch.no_grad()
def time_prefill(config, model, tokens: int, repeats: int, device: str) -> Measurement:
    """One forward pass over a prompt of `tokens` tokens."""
    from transformers import StaticCache

    prompt = torch.randint(0, config.vocab_size, (1, tokens), device=device)
    positions = torch.arange(tokens, device=device)

    def run() -> None:
        cache = StaticCache(config=config, max_cache_len=tokens)
        model(input_ids=prompt, past_key_values=cache, cache_position=positions, logits_to_keep=1)

    run()
    return Measurement("prefill", 1, tokens, _median_ms(run, repeats, device), False)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def main() -> None:
    parser = benchmark_parser(__doc__, chart=False, quick=False, json=None)
    parser.add_argument("--layers", type=int, default=LLAMA3_8B["num_hidden_layers"])
    parser.add_argument("--batches", default="1,8,32,64,128,192,256")
    parser.add_argument("--contexts", default="512,1024", help="tokens each decoding sequence already holds")
    parser.add_argument("--prefill", default="512,1024,2048,4096,8192", help="prompt tokens per prefill pass")
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per measurement (3 with --quick)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    repeats = 3 if args.quick else args.repeats
    config, model = build_model(args.layers, device)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"device: {name}; model: Llama-3-8B shapes, {args.layers} layers, bf16, random weights")
    measurements: list[Measurement] = []
    for context in [int(value) for value in args.contexts.split(",")]:
        for batch in [int(value) for value in args.batches.split(",")]:
            measurements.append(time_decode(config, model, batch, context, repeats, device))
            print(f"  decode  batch {batch:4d} context {context:5d}: {measurements[-1].ms:8.3f} ms", flush=True)
    for tokens in [int(value) for value in args.prefill.split(",")]:
        measurements.append(time_prefill(config, model, tokens, repeats, device))
        print(f"  prefill tokens {tokens:5d}: {measurements[-1].ms:8.3f} ms", flush=True)
    fits = {}
    for context in sorted({m.tokens for m in measurements if m.kind == "decode"}):
        decode = [m for m in measurements if m.kind == "decode" and m.tokens == context]
        t0, a = fit_line([m.batch for m in decode], [m.ms for m in decode])
        fits[f"decode_context_{context}"] = {"t0_ms": t0, "a_ms_per_seq": a}
    prefill = [m for m in measurements if m.kind == "prefill"]
    intercept, b = fit_line([m.tokens for m in prefill], [m.ms for m in prefill])
    fits["prefill"] = {"intercept_ms": intercept, "b_ms_per_token": b}
    rows = [[m.kind, m.batch, m.tokens, f"{m.ms:.3f}", "yes" if m.graph else "no"] for m in measurements]
    print("\n" + markdown_table(["kind", "batch", "tokens", "ms", "CUDA graph"], rows, align="lrrrl"))
    print("\nfit (step time = t0 + a * decode_seqs + b * prefill_tokens):")
    for label, fit in fits.items():
        print(f"  {label}: " + ", ".join(f"{key} = {value:.4f}" for key, value in fit.items()))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "device": name,
                    "layers": args.layers,
                    "measurements": [asdict(m) for m in measurements],
                    "fits": fits,
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
