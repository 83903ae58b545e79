"""The driver image: every job's driver runs on it (reads the data, fans chunks out, writes the results); no GPU stack.

Build it and push it to your registry, from the repository's root (see `images/README.md`):

    BATCH_LLM_IMAGE_REGISTRY=ghcr.io/me flyte build images/driver.py env

and run the jobs on the URI it prints: `BATCH_LLM_DRIVER_IMAGE=<uri> flyte deploy workflows/batch_llm.py driver_env`.
"""

from __future__ import annotations

import flyte

from flyteplugins_batcher.images import DRIVER_SPEC

image = DRIVER_SPEC.image()
# image = image.with_pip_packages("s3fs")  # adapt it: one more package (and so a new tag)
env = flyte.TaskEnvironment("batch-llm-driver-image", image=image)
