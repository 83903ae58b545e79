"""Two small LoRA adapters for SmolLM2, made with `peft` at test time (never committed): random, seeded weights.

`init_lora_weights=False` draws both LoRA matrices at random (peft's default starts B at zero, an
adapter that changes nothing), so each adapter answers differently from the base model and from
the other, the same way in every run.
"""

from __future__ import annotations

from pathlib import Path

ADAPTER_SEEDS = {"alpha": 1, "beta": 2}
"""Each adapter's name and the seed its weights are drawn with."""

RANK = 8
TARGET_MODULES = ("q_proj", "v_proj")


def make_adapters(folder: Path, base_model: str) -> dict[str, str]:
    """Write each adapter of `ADAPTER_SEEDS` under `folder`; name -> path, as `lora_modules` takes them."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapters = {}
    for name, seed in ADAPTER_SEEDS.items():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
        config = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(TARGET_MODULES), init_lora_weights=False)
        get_peft_model(model, config).save_pretrained(folder / name)
        adapters[name] = str(folder / name)
    return adapters


def lora_flag(adapters: dict[str, str]) -> list[str]:
    """`--lora-modules name=path ...`, as vLLM's command line and ours take them."""
    return ["--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
