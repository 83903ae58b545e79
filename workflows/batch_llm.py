"""gsm8k with batched LLM inference on reusable GPU replicas: the package's ready-made job.

    flyte run --local workflows/batch_llm.py main                 # on a laptop: bundled SmolLM2 on CPU, offline
    flyte run --local workflows/batch_llm.py main --engine vllm   # the same through real vLLM (its CPU build)
    flyte run workflows/batch_llm.py main --num_questions 1319 --model Qwen/Qwen2.5-1.5B-Instruct
    flyte deploy workflows/batch_llm.py driver_env               # the driver and the GPU replicas it calls

`main` fans chunks of questions out to `infer_chunk` on the GPU replicas (`gpu_env`); each replica
holds one engine and one shared batcher. `flyte run ... main --help` lists every option.
"""

from flyteplugins_batcher.jobs import gsm8k_driver_env as driver_env
from flyteplugins_batcher.jobs import solve_gsm8k as main

__all__ = ["driver_env", "main"]
