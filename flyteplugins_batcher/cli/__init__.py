"""The command line: `flyteplugins-batcher run-batch | run-table | serve | gsm8k`.

The same commands run as `flyte batcher ...` (flyte's plugin entry point) and `python -m flyteplugins_batcher`.

Example:
    ```bash
    flyteplugins-batcher run-batch -i requests.jsonl -o out/ --model Qwen/Qwen2.5-0.5B-Instruct
    flyteplugins-batcher run-table -i questions.parquet -o answers/ --prompt "Answer briefly: {question}"
    flyteplugins-batcher serve --port 8000
    flyteplugins-batcher gsm8k --num-questions 64
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.cli._main import batcher, main

__all__ = ["batcher", "main"]
