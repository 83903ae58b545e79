"""What a deploy would send: the serialized task specs and the deployment plan, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import flyte
from flyte._deploy import plan_deploy  # the planning step of `flyte deploy`, pure and offline
from flyte.extras import serialize_env

import images
from workflows import batch_jsonl, batch_llm, llm_replica

REPO_ROOT = Path(__file__).resolve().parents[2]


def spec_of(env: flyte.TaskEnvironment, task_name: str):
    specs = {spec.task_template.id.name: spec for spec in serialize_env(env)}
    return specs[f"{env.name}.{task_name}"]


def test_gpu_task_spec_carries_the_reuse_policy_accelerator_retries_and_cache():
    template = spec_of(llm_replica.gpu_env, "infer_chunk").task_template
    policy = template.reuse_policy
    assert (policy.min_replicas, policy.max_replicas, policy.concurrency) == (2, 2, 10)
    assert template.extended_resources.gpu_accelerator.device == "nvidia-l4"
    assert template.metadata.retries.retries == llm_replica.CHUNK_RETRIES
    assert template.metadata.discoverable  # finished chunks are cached: a re-run resumes


def test_driver_task_specs_are_plain_tasks():
    for module in (batch_llm, batch_jsonl):
        template = spec_of(module.driver_env, "main").task_template
        assert not template.HasField("reuse_policy")
        assert not template.extended_resources.HasField("gpu_accelerator")


def test_the_deploy_plan_covers_both_environments():
    (plan,) = plan_deploy(batch_llm.driver_env)
    assert set(plan.envs) == {"batch_llm_driver", "batch_llm_gpu"}


def test_images_are_defined_once_with_what_each_side_needs():
    gpu, driver = images.build_gpu_image(), images.build_driver_image()
    assert llm_replica.gpu_env.image == gpu and batch_llm.driver_env.image == driver
    layers = repr(gpu._layers)
    for package in ("vllm", "hf-transfer", "nvidia-ml-py", "unionai-reuse"):
        assert package in layers
    assert "HF_HUB_ENABLE_HF_TRANSFER" in layers
    assert "datasets" in repr(driver._layers) and "vllm" not in repr(driver._layers)
    assert gpu.platform == ("linux/amd64",)


def test_replicas_concurrency_gpu_and_images_can_be_set_from_the_environment():
    probe = (
        "import json; from workflows import batch_llm as w, llm_replica as r; "
        "p = r.gpu_env.reusable; "
        "print(json.dumps([p.replicas, p.concurrency, r.gpu_env.image, w.driver_env.image, "
        "str(r.gpu_env.resources.gpu)]))"
    )
    env = {
        **os.environ,
        "BATCH_LLM_REPLICAS": "3",
        "BATCH_LLM_CONCURRENCY": "16",
        "BATCH_LLM_GPU": "A100:1",
        "BATCH_LLM_GPU_IMAGE": "ghcr.io/me/gpu:v3",
        "BATCH_LLM_DRIVER_IMAGE": "ghcr.io/me/driver:v3",
    }
    output = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    replicas, concurrency, gpu_image, driver_image, gpu = json.loads(output.strip().splitlines()[-1])
    assert (replicas, concurrency) == ([3, 3], 16)  # flyte normalizes an int to (min, max)
    assert (gpu_image, driver_image) == ("ghcr.io/me/gpu:v3", "ghcr.io/me/driver:v3")
    assert "A100" in gpu


def test_flyte_cli_image_overrides_are_read_from_the_command_line():
    argv = [
        "flyte",
        "run",
        "--image",
        "batch-llm-gpu=ghcr.io/me/gpu:v3",
        "--image=batch-llm-driver=ghcr.io/me/d:1",
        "--image",
        "ghcr.io/me/default:2",
        "workflows/batch_llm.py",
        "main",
    ]
    assert images._cli_image_refs(argv) == {
        "batch-llm-gpu": "ghcr.io/me/gpu:v3",
        "batch-llm-driver": "ghcr.io/me/d:1",
    }
