"""Small LoRA adapters and a second checkpoint for the bundled SmolLM2, made with `peft` at run time (never committed).

`init_lora_weights=False` draws both LoRA matrices at random (peft's default starts B at zero, an
adapter that changes nothing), so each adapter answers differently from the base model and from
the other, the same way in every run. The second checkpoint is SmolLM2 with one more such adapter
merged into its weights and saved whole: another base model, of the same size and tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ADAPTER_SEEDS = {"alpha": 1, "beta": 2}
"""Each adapter's name and the seed its weights are drawn with."""

MERGED_SEED = 3
"""The seed of the adapter merged into the second checkpoint."""

RANK = 8
TARGET_MODULES = ("q_proj", "v_proj")


def _with_random_lora(base_model: str, seed: int) -> Any:
    """SmolLM2 with a LoRA adapter of random, seeded weights (a peft model)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(TARGET_MODULES), init_lora_weights=False)
    return get_peft_model(model, config)


def make_adapters(folder: Path, base_model: str) -> dict[str, str]:
    """Write each adapter of `ADAPTER_SEEDS` under `folder`; name -> path, as `lora_modules` takes them."""
    adapters = {}
    for name, seed in ADAPTER_SEEDS.items():
        _with_random_lora(base_model, seed).save_pretrained(folder / name)
        adapters[name] = str(folder / name)
    return adapters


def make_merged_model(folder: Path, base_model: str, seed: int = MERGED_SEED) -> str:
    """Write a second checkpoint to `folder` (weights, config, tokenizer, chat template); its path.

    It is `base_model` with a seeded random adapter merged into its weights: a model folder of its
    own, which vLLM and Transformers load as they load any checkpoint.
    """
    from transformers import AutoTokenizer

    _with_random_lora(base_model, seed).merge_and_unload().save_pretrained(folder)
    AutoTokenizer.from_pretrained(base_model).save_pretrained(folder)
    return str(folder)


def lora_flag(adapters: dict[str, str]) -> list[str]:
    """`--lora-modules name=path ...`, as vLLM's command line and ours take them."""
    return ["--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
