"""The embeddings image: the embedding replicas run on it, with sentence-transformers and all-MiniLM-L6-v2 offline.

Build it and push it to your registry, from the repository's root (see `images/README.md`):

    BATCH_LLM_IMAGE_REGISTRY=ghcr.io/me flyte build images/embeddings.py env

and run the jobs on the URI it prints: `EMBED_GPU_IMAGE=<uri> flyte deploy workflows/embed.py driver_env`.
"""

from __future__ import annotations

import flyte

from flyteplugins_batcher.images import EMBED_SPEC

image = EMBED_SPEC.image()
# image = image.with_pip_packages("einops")  # adapt it: one more package (and so a new tag)
env = flyte.TaskEnvironment("embed-gpu-image", image=image)
