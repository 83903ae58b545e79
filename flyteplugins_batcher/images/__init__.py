"""The default container images of the jobs and the server, each installing this plugin with the extras it needs.

Example:
    ```python
    import flyte
    from flyteplugins_batcher.images import GPU_SPEC, gpu_image

    env = flyte.TaskEnvironment("my_gpu_tasks", image=gpu_image)  # vLLM, NVML, reusable containers, this plugin
    custom = GPU_SPEC.build().with_pip_packages("my-tokenizer")  # the same, and one more package
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.images._specs import (
    ALL_SPECS,
    DRIVER_SPEC,
    EMBED_SPEC,
    GPU_SPEC,
    SERVE_SPEC,
    ImageSpec,
    driver_image,
    embed_image,
    gpu_image,
    serve_image,
    source_checkout,
)

__all__ = [
    "ALL_SPECS",
    "DRIVER_SPEC",
    "EMBED_SPEC",
    "GPU_SPEC",
    "SERVE_SPEC",
    "ImageSpec",
    "driver_image",
    "embed_image",
    "gpu_image",
    "serve_image",
    "source_checkout",
]
