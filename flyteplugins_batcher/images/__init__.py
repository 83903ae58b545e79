"""The default container images of the jobs and the server, each installing this plugin with the extras it needs.

One `ImageSpec` per part: `GPU_SPEC` (the LLM replicas), `DRIVER_SPEC` (every job's driver),
`EMBED_SPEC` (the embedding replicas), `SERVE_SPEC` (the OpenAI-compatible app). `spec.resolve()` is
the image that part runs on: the URI in its override variable when one is set, else `spec.image()`.
The repository's `images/` folder has one module per image, to build and push with `flyte build`.

Example:
    ```python
    import flyte
    from flyteplugins_batcher.images import GPU_SPEC

    env = flyte.TaskEnvironment("my_gpu_tasks", image=GPU_SPEC.resolve())  # vLLM, NVML, reusable containers
    custom = GPU_SPEC.image().with_pip_packages("my-tokenizer")  # the same, and one more package
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.images._specs import ALL_SPECS, DRIVER_SPEC, EMBED_SPEC, GPU_SPEC, SERVE_SPEC, ImageSpec

__all__ = ["ALL_SPECS", "DRIVER_SPEC", "EMBED_SPEC", "GPU_SPEC", "SERVE_SPEC", "ImageSpec"]
