"""Models and LoRA adapters in object storage (`s3://`, `gs://`, `abfs://`), read through Flyte's own storage.

A model folder in a bucket (a Hugging Face checkpoint: `config.json`, the tokenizer's files, `*.safetensors`)
is checked before anything loads (`StoredModel.check`: the bucket, the credentials, a prefix that holds weights,
each failure named, never a secret), its small files are kept in a local cache per replica (`local_files`: the
tokenizer and config, which the libraries read from a folder), and its weights are streamed by
`flyte.extras.model_streamer` straight to the device (the engines do it: `load_hf_model` for Transformers,
`flyteplugins-vllm`'s load format for vLLM), never written to disk. An adapter folder is small: it is
downloaded whole to the cache (`local_adapters`).

Credentials and endpoint are the ones Flyte's storage reads: in a Flyte task, the run's storage settings; elsewhere
the standard variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
`AWS_PROFILE`, ...) as boto3 and obstore read them, or `FLYTE_AWS_ENDPOINT` and Flyte's own keys. A model in the
run's own storage is an `s3://` (or `gs://`, `abfs://`) URI in the run's bucket, read with the run's credentials.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import re
import shutil
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from flyteplugins_batcher.engines._engine_errors import EngineConfigError, ModelNotFoundError, redact

T = TypeVar("T")

REMOTE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss")
"""The object stores a model or an adapter may live in, as Flyte's storage reads them."""

WEIGHTS_SUFFIX = ".safetensors"

_S3_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "FLYTE_AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)
"""Where boto3 and obstore find S3 credentials in the environment; else only the instance metadata service."""

_REFUSED = re.compile(r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|403 Forbidden|401 Unauthorized|Expired")
_NO_BUCKET = re.compile(r"NoSuchBucket|ContainerNotFound|bucket does not exist", re.IGNORECASE)
_UNREACHABLE = re.compile(r"Connect|connection|dns error|timed out|tcp connect", re.IGNORECASE)


def is_remote(reference: str | os.PathLike[str] | None) -> bool:
    """Whether a model or adapter reference is an object-store URI (`s3://bucket/prefix`, `gs://`, `abfs://`).

    Example:
        ```python
        assert is_remote("s3://models/smollm2") and not is_remote("HuggingFaceTB/SmolLM2-135M-Instruct")
        ```
    """
    if reference is None:
        return False
    scheme, separator, rest = os.fspath(reference).partition("://")
    return bool(separator) and scheme.lower() in REMOTE_SCHEMES and bool(rest.strip("/"))


@dataclass(frozen=True)
class StoredModel:
    """A model folder under an object-store prefix: checked, its small files cached, its weights left to stream.

    Attributes:
        uri: The prefix, as given (`s3://bucket/models/smollm2`).

    Example:
        ```python
        stored = StoredModel("s3://models/smollm2")
        stored.check()  # ModelNotFoundError / EngineConfigError before any load
        tokenizer = AutoTokenizer.from_pretrained(stored.local_files())
        ```
    """

    uri: str

    @property
    def name(self) -> str:
        """The prefix's last part (`smollm2`)."""
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    def check(self, *, needs_weights: bool = True) -> dict[str, int]:
        """The files under the prefix (name -> size), after checking that it can load.

        Raises:
            EngineConfigError: No credentials, or the store refused them, or it cannot be reached.
            ModelNotFoundError: The bucket does not exist, nothing is under the prefix, or (with
                `needs_weights`) no `config.json` or no `*.safetensors` weights are there.
        """
        check_credentials(self.uri)
        files = self._listing()
        if not files:
            raise ModelNotFoundError(f"model {self.uri!r}: nothing is stored under this prefix")
        if needs_weights:
            missing = [name for name in ("config.json",) if name not in files]
            if not any(name.endswith(WEIGHTS_SUFFIX) for name in files):
                missing.append(f"*{WEIGHTS_SUFFIX} weights")
            if missing:
                raise ModelNotFoundError(
                    f"model {self.uri!r} holds no {' and no '.join(missing)} (found: {', '.join(sorted(files)[:8])}): "
                    "store a Hugging Face checkpoint saved as safetensors under the prefix"
                )
        return files

    def cache_folder(self) -> Path:
        """This replica's local folder for the model's small files (and a whole download)."""
        from flyteplugins_batcher.engines._smollm2 import cache_root

        digest = hashlib.sha256(self.uri.rstrip("/").encode()).hexdigest()[:16]
        return cache_root() / "object-store" / f"{self.name}-{digest}"

    def local_files(self) -> Path:
        """The model's files other than its weights (config, tokenizer, chat template), checked and cached once.

        A replica that loads the model again (a second engine, a reload) reads them from its cache.

        Raises:
            EngineConfigError: As `check`.
        """
        folder = self.cache_folder() / "metadata"
        files = self.check()
        wanted = {name: size for name, size in files.items() if not name.endswith(WEIGHTS_SUFFIX)}
        if not _cached(folder, wanted):
            from flyte.extras.model_streamer import ModelStreamer

            staging = _fresh(folder.with_name("metadata.partial"))
            self.read(ModelStreamer(self.uri).download_metadata(staging))
            _replace(staging, folder)
        return folder

    def download(self, folder: Path | None = None) -> Path:
        """Every file under the prefix, weights included, in `folder` (default: the cache); for what cannot stream.

        Raises:
            EngineConfigError: As `check` (weights not required: an adapter folder has none of a model's).
        """
        import flyte.storage

        files = self.check(needs_weights=False)
        target = folder or self.cache_folder() / "whole"
        if folder is None and _cached(target, files):
            return target
        staging = _fresh(target.with_name(target.name + ".partial"))
        self.read(flyte.storage.get(self.uri.rstrip("/"), str(staging), recursive=True))
        _replace(staging, target)
        return target

    def _listing(self) -> dict[str, int]:
        """The files under the prefix, by their path below it."""
        import flyte.storage

        prefix = self.uri.rstrip("/")
        try:
            filesystem = flyte.storage.get_underlying_filesystem(path=prefix)
            entries = filesystem.find(prefix, detail=True)
        except FileNotFoundError:
            return {}
        except Exception as error:
            raise storage_error(self.uri, error) from None
        root = prefix.split("://", 1)[1]
        return {name[len(root) :].lstrip("/"): int(info.get("size") or 0) for name, info in entries.items()}

    def read(self, reading: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that reads this model from the store (a streamer's), its failures named as `check`'s."""
        try:
            return run_coroutine(reading)
        except EngineConfigError:
            raise
        except Exception as error:
            raise storage_error(self.uri, error) from None


def check_credentials(uri: str) -> None:
    """Fail at once when an S3 URI has no credentials to read it with (rather than as a slow timeout).

    Raises:
        EngineConfigError: Naming the variables that would give them (never their values).
    """
    if not uri.lower().startswith("s3://"):
        return
    if any(os.environ.get(name) for name in _S3_CREDENTIALS) or _flyte_storage_has_keys():
        if os.environ.get("AWS_ACCESS_KEY_ID") and not os.environ.get("AWS_SECRET_ACCESS_KEY"):
            raise EngineConfigError(f"model {uri!r}: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")
        return
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() in ("1", "true", "yes"):
        raise EngineConfigError(
            f"model {uri!r}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL "
            "for a store other than AWS), or AWS_PROFILE, or run where a role gives them"
        )


def storage_error(uri: str, error: BaseException) -> EngineConfigError:
    """The error that names what is wrong with reading `uri` (the store's own words, credentials masked)."""
    said = redact(" ".join(str(error).split()))[:400]
    bucket = uri.split("://", 1)[-1].split("/", 1)[0]
    if _NO_BUCKET.search(said):
        return ModelNotFoundError(f"{uri!r}: the bucket {bucket!r} does not exist ({said})")
    if _REFUSED.search(said):
        return EngineConfigError(
            f"{uri!r}: the store refused the credentials (check the key, its secret, its access "
            f"to bucket {bucket!r}): {said}"
        )
    if _UNREACHABLE.search(said):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("FLYTE_AWS_ENDPOINT") or "the store's"
        return EngineConfigError(f"{uri!r}: cannot reach {redact(endpoint)} endpoint: {said}")
    return EngineConfigError(f"{uri!r}: cannot read it: {type(error).__name__}: {said}")


def local_adapters(lora_modules: Mapping[str, str]) -> dict[str, str]:
    """`lora_modules` with each adapter in object storage downloaded to the cache (a local folder in its place).

    Raises:
        EngineConfigError: An adapter's URI cannot be read (see `StoredModel.check`).
    """
    return {name: str(StoredModel(path).download()) if is_remote(path) else path for name, path in lora_modules.items()}


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end from synchronous code, in a thread of its own when this one runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="object-store") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _flyte_storage_has_keys() -> bool:
    """Whether Flyte's storage settings (a task's, or `FLYTE_AWS_*`) give static S3 keys."""
    try:
        from flyte.storage import get_configured_fsspec_kwargs

        config = get_configured_fsspec_kwargs("s3").get("config") or {}
    except Exception:
        return False
    return bool(config.get("access_key_id"))


def _cached(folder: Path, files: Mapping[str, int]) -> bool:
    """Whether `folder` holds every file of `files` at its size (a cache filled by an earlier load)."""
    return folder.is_dir() and all(
        (folder / name).is_file() and (folder / name).stat().st_size == size for name, size in files.items()
    )


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _replace(staging: Path, folder: Path) -> None:
    """Put a finished download in place (a half-written one never is)."""
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
