"""Models and LoRA adapters in object storage, read from a real S3-compatible server the tests start (moto's).

The bundled SmolLM2 (float32 safetensors) is uploaded under `s3://models/smollm2`; the engines load it from there
through Flyte's storage and model streamer, and answer exactly as from the local folder. A bad bucket, missing
credentials and a prefix without weights fail at load, before any inference, naming what is wrong; no message
shows the secret key.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("moto", reason="needs moto[server]: the test extra brings it")

from benchmarks._s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Server
from flyteplugins_batcher.engines import (
    EngineConfigError,
    GenerationConfig,
    ModelNotFoundError,
    Request,
    bundled_smollm2_path,
    create_engine,
    model_display_name,
)
from flyteplugins_batcher.engines._engine_errors import redact
from flyteplugins_batcher.engines._model_reference import check_model_reference
from flyteplugins_batcher.engines._object_store import StoredModel, is_remote

QUESTIONS = ["What is 2 + 2?", "Name three primary colors.", "Write one sentence about the ocean."]
GREEDY = GenerationConfig(max_new_tokens=16)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The S3 server holding the bundled SmolLM2 at `s3://models/smollm2` and a config-only prefix; the standard
    AWS variables point at it (and the model cache is this module's own) while the module runs."""
    saved = dict(os.environ)
    with S3Server.running() as server:
        os.environ.update(server.environment())
        os.environ["FLYTEPLUGINS_BATCHER_CACHE"] = str(tmp_path_factory.mktemp("cache"))
        model = bundled_smollm2_path()
        server.upload_folder(model, "models", "smollm2")
        server.upload_folder(model, "models", "config-only", only={"config.json": "config.json"})
        try:
            yield server
        finally:
            os.environ.clear()
            os.environ.update(saved)


def texts(engine: Any, records: list[Any]) -> list[str]:
    return [completion.text for completion in engine.generate(records)]


def test_object_store_uris_are_model_references_named_by_their_last_part() -> None:
    check_model_reference("s3://models/smollm2")  # no network: the load checks it
    assert is_remote("gs://bucket/a/b") and is_remote("abfs://container/model") and not is_remote("s3://")
    assert not is_remote("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert model_display_name("s3://models/team/SmolLM2-135M-Instruct/") == "SmolLM2-135M-Instruct"


def test_redact_masks_every_credential_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789")
    said = redact("refused wJalrXUtnFEMI-secret with Bearer sk-other-thing and sk-test-0123456789")
    assert "wJalrXUtnFEMI" not in said and "sk-test" not in said and "sk-other" not in said
    assert said.startswith("refused ***")


@pytest.mark.slow
def test_transformers_streams_the_model_and_answers_as_from_the_local_folder(s3: S3Server) -> None:
    local = create_engine("transformers", str(bundled_smollm2_path()), generation=GREEDY, device="cpu")
    remote = create_engine("transformers", "s3://models/smollm2", generation=GREEDY, device="cpu")
    with local:
        expected = texts(local, QUESTIONS)
    with remote:
        assert texts(remote, QUESTIONS) == expected
        assert remote.model_name == "smollm2"
    cached = StoredModel("s3://models/smollm2").cache_folder() / "metadata"
    assert (cached / "tokenizer.json").is_file() and not list(cached.glob("*.safetensors"))  # weights never on disk


@pytest.mark.slow
def test_a_lora_adapter_loads_from_object_storage(s3: S3Server, lora_adapters: dict[str, str]) -> None:
    name, folder = next(iter(lora_adapters.items()))
    uri = s3.upload_folder(folder, "adapters", name)
    record = Request(QUESTIONS[0], GREEDY, adapter=name)
    local = create_engine("transformers", generation=GREEDY, device="cpu", lora_modules={name: folder})
    remote = create_engine("transformers", generation=GREEDY, device="cpu", lora_modules={name: uri})
    with local:
        expected = texts(local, [record])
    with remote:
        assert texts(remote, [record]) == expected


@pytest.mark.parametrize(
    ("uri", "error", "named"),
    [
        ("s3://no-such-bucket/smollm2", ModelNotFoundError, "the bucket 'no-such-bucket' does not exist"),
        ("s3://models/config-only", ModelNotFoundError, "holds no *.safetensors weights"),
        ("s3://models/nothing-here", ModelNotFoundError, "nothing is stored under this prefix"),
    ],
)
def test_a_model_that_cannot_load_fails_at_load_naming_what_is_wrong(
    s3: S3Server, uri: str, error: type[Exception], named: str
) -> None:
    engine = create_engine("transformers", uri, generation=GREEDY, device="cpu")
    with pytest.raises(error, match=named.replace("*", r"\*")) as raised:
        engine.load()
    assert not engine.is_loaded
    assert SECRET_ACCESS_KEY not in str(raised.value) and ACCESS_KEY_ID not in str(raised.value)


def test_missing_credentials_fail_before_the_store_is_asked(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # nothing else could give them
    with pytest.raises(EngineConfigError, match="no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        StoredModel("s3://models/smollm2").check()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    with pytest.raises(EngineConfigError, match="AWS_SECRET_ACCESS_KEY is not") as raised:
        StoredModel("s3://models/smollm2").check()
    assert ACCESS_KEY_ID not in str(raised.value)


@pytest.mark.slow
def test_vllm_streams_the_model_with_flytes_load_format_and_answers_as_from_the_local_folder(s3: S3Server) -> None:
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    pytest.importorskip("flyteplugins.vllm", reason="needs flyteplugins-vllm (the vllm extra)")
    small = {"max_model_len": 512, "kv_cache_memory_bytes": 1 << 28, "dtype": "float32", "enforce_eager": True}
    answers = []
    for model in (str(bundled_smollm2_path()), "s3://models/smollm2"):
        engine = create_engine("vllm", model, mode="batch", generation=GREEDY, **small)
        with engine:
            answers.append(texts(engine, QUESTIONS))
        if model.startswith("s3://"):
            assert engine.source.endswith("vllm")  # config and tokenizer from the cache; weights streamed
    assert answers[1] == answers[0]
