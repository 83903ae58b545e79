"""inference_environment: the reusable GPU worker environment, validated up front."""

from __future__ import annotations

import pytest
from flyte.extras import serialize_env

import flyteplugins_batcher as ours


def test_builds_a_reusable_gpu_environment():
    env = ours.inference_environment("gpu_worker_test", gpu="L4:1", replicas=3, concurrency=8)

    @env.task
    async def infer(x: int) -> int:
        return x

    (spec,) = serialize_env(env)
    template = spec.task_template
    assert template.reuse_policy.min_replicas == 3 and template.reuse_policy.max_replicas == 3
    assert template.reuse_policy.concurrency == 8
    assert template.extended_resources.gpu_accelerator.device == "nvidia-l4"
    assert not any(name.startswith("HF_") for name in env.env_vars)  # Hugging Face settings belong to the image


@pytest.mark.parametrize("replicas", [0, -1, (0, 0), (3, 1), (1, 2, 3), "2", True])
def test_rejects_replica_settings_that_cannot_host_a_model(replicas):
    with pytest.raises(ValueError, match="replicas"):
        ours.inference_environment("bad_replicas", replicas=replicas)


def test_rejects_concurrency_below_one():
    with pytest.raises(ValueError, match="concurrency"):
        ours.inference_environment("bad_concurrency", concurrency=0)


def test_warns_when_nothing_can_be_batched_across_tasks():
    with pytest.warns(ours.ReplicaStarvationWarning, match="one task at a time"):
        ours.inference_environment("starved", replicas=1, concurrency=1)


def test_concurrent_replicas_need_async_tasks():
    env = ours.inference_environment("sync_task_env", replicas=2, concurrency=4)
    with pytest.raises(ValueError, match="async"):

        @env.task
        def blocking(x: int) -> int:
            return x


def test_cpu_only_environment_has_no_accelerator():
    env = ours.inference_environment("cpu_worker_test", gpu=None)

    @env.task
    async def infer(x: int) -> int:
        return x

    (spec,) = serialize_env(env)
    assert not spec.task_template.extended_resources.HasField("gpu_accelerator")
