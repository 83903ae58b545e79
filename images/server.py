"""The server image: the OpenAI-compatible app (`BatcherAppEnvironment`) runs on it, with vLLM and all-MiniLM-L6-v2.

Build it and push it to your registry, from the repository's root (see `images/README.md`):

    BATCH_LLM_IMAGE_REGISTRY=ghcr.io/me flyte build images/server.py env

and serve on the URI it prints: `BATCH_SERVE_IMAGE=<uri> flyte deploy workflows/serve.py app_env`.
"""

from __future__ import annotations

import flyte

from flyteplugins_batcher.images import SERVE_SPEC

image = SERVE_SPEC.image()
# image = image.with_pip_packages("my-tokenizer")  # adapt it: one more package (and so a new tag)
env = flyte.TaskEnvironment("batch-serve-gpu-image", image=image)
