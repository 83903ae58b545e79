"""The GPU replica image: the LLM replicas (`infer_chunk`) run on it, with vLLM, NVML and reusable containers.

Build it and push it to your registry, from the repository's root (see `images/README.md`):

    BATCH_LLM_IMAGE_REGISTRY=ghcr.io/me flyte build images/gpu_replica.py env

and run the jobs on the URI it prints: `BATCH_LLM_GPU_IMAGE=<uri> flyte deploy workflows/batch_llm.py driver_env`.
"""

from __future__ import annotations

import flyte

from flyteplugins_batcher.images import GPU_SPEC

image = GPU_SPEC.image()
# image = image.with_pip_packages("my-tokenizer")  # adapt it: one more package (and so a new tag)
env = flyte.TaskEnvironment("batch-llm-gpu-image", image=image)
