"""The command line: `flyteplugins-batcher run-batch | serve | gsm8k`.

The same commands run as `flyte batcher ...` (flyte's plugin entry point) and `python -m flyteplugins_batcher`.

Example:
    ```bash
    flyteplugins-batcher run-batch -i requests.jsonl -o out/ --model Qwen/Qwen2.5-0.5B-Instruct
    flyteplugins-batcher serve --port 8000
    flyteplugins-batcher gsm8k --num-questions 64
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.cli._main import batcher, main

__all__ = ["batcher", "main"]
