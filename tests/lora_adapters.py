"""Two small LoRA adapters and a second checkpoint for SmolLM2, made with `peft` at test time (never committed).

They are the benchmarks' (`benchmarks/_lora_models.py`), so that a test and a benchmark run the same models.
"""

from __future__ import annotations

from benchmarks._lora_models import ADAPTER_SEEDS, RANK, TARGET_MODULES, lora_flag, make_adapters, make_merged_model

__all__ = ["ADAPTER_SEEDS", "RANK", "TARGET_MODULES", "lora_flag", "make_adapters", "make_merged_model"]
