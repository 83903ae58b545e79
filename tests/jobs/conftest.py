"""Fixtures for running the workflows through flyte's real local runner."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import flyte
import flyte.errors
import pytest

from flyteplugins_batcher import TokenBatcher
from flyteplugins_batcher.engines import InvalidResponseFormatError
from flyteplugins_batcher.replica import LLMReplica
from flyteplugins_batcher.replica._llm import make_batcher


@pytest.fixture(scope="session")
def run_locally() -> Callable[..., Any]:
    """Run a task with flyte's local runner (not a direct call) and return its output.

    Flyte's run cache is off unless a test asks for it (`cache=True`): a chunk finished by one test
    must not answer for another.
    """
    flyte.init()

    def run(task: Any, *, cache: bool = False, **inputs: Any) -> Any:
        execution = flyte.with_runcontext(mode="local", disable_run_cache=not cache).run(task, **inputs)
        return execution.outputs()[0]

    return run


class Replicas:
    """The replicas a test ran this process's chunks on; all closed when it ends."""

    def __init__(self) -> None:
        self.used: list[LLMReplica] = []

    def use(self, replica: LLMReplica) -> LLMReplica:
        """Run this process's chunks on `replica` from now on, as a freshly started replica would."""
        self.used.append(replica)
        replica.install()
        return replica


@pytest.fixture(autouse=True)
def replicas() -> Iterator[Replicas]:
    """Each test runs its chunks on replicas of its own, starting with a fresh default one."""
    tracker = Replicas()
    tracker.use(LLMReplica())
    yield tracker
    assert LLMReplica.of_process() is tracker.used[-1]
    for replica in tracker.used:
        close_on_its_loop(replica)  # the process's next replica is a fresh one


@pytest.fixture
def cached_run(run_locally: Callable[..., Any], replicas: Replicas) -> Callable[..., Any]:
    """Run a task with Flyte's cache on a fresh replica whose engine calls a `CountingBatcher` sees.

    `cached_run(task, counting, fails="message", **inputs)` expects the run to fail with that message.
    """

    def run(task: Any, counting: CountingBatcher, *, fails: str | None = None, **inputs: Any) -> Any:
        replicas.use(LLMReplica(counting.make))
        if fails is None:
            return run_locally(task, cache=True, **inputs)
        with pytest.raises(flyte.errors.RuntimeUserError, match=fails):
            run_locally(task, cache=True, **inputs)
        return None

    return run


@pytest.fixture
def fresh_replica(replicas: Replicas) -> LLMReplica:
    """The replica this test's chunks run on."""
    return replicas.used[-1]


def close_on_its_loop(replica: LLMReplica) -> None:
    """Stop a replica on the event loop its batcher runs on (flyte's runner thread), or here."""
    batcher = replica.shared.batcher
    loop = batcher.loop if batcher is not None else None
    if loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(replica.aclose(), loop).result(timeout=60)
    else:
        asyncio.run(replica.aclose())


class CountingBatcher:
    """Wraps the replica's batcher factory to count what reaches the engine, and to inject faults.

    Args:
        fail_when: A batch holding a prompt for which it is true fails as a whole (`error` is raised).
        error: What such a batch raises.
        refuse_when: A prompt for which it is true fails alone, with an `invalid_request` error in its
            place, as a record that needs a missing package does.
    """

    def __init__(
        self,
        fail_when: Callable[[str], bool] | None = None,
        error: type[Exception] = RuntimeError,
        refuse_when: Callable[[str], bool] | None = None,
    ) -> None:
        self.prompts: list[str] = []
        self.fail_when = fail_when or (lambda _text: False)
        self.error = error
        self.refuse_when = refuse_when or (lambda _text: False)

    def make(self, engine: Any, settings: Any) -> Any:
        real = engine.generate

        def generate(records: list[Any]) -> list[Any]:
            texts, runnable = self._admit(records)
            return self._answers(texts, real(runnable) if runnable else [])

        async def generate_async(records: list[Any]) -> list[Any]:  # a streaming engine's (vLLM's, simulated)
            texts, runnable = self._admit(records)
            return self._answers(texts, await real(runnable) if runnable else [])

        return TokenBatcher(
            inference_fn=generate_async if inspect.iscoroutinefunction(real) else generate,
            token_estimator=engine.estimate_tokens,
            on_error="split",
            max_batch_size=16,
        )

    def _admit(self, records: list[Any]) -> tuple[list[str], list[Any]]:
        """The batch's prompt texts, and the records to send to the engine (a batch that must fail raises)."""
        texts = [prompt_text(record) for record in records]
        if any(self.fail_when(text) for text in texts):
            raise self.error("the GPU fell off the bus")
        self.prompts.extend(texts)
        return texts, [record for record, text in zip(records, texts, strict=True) if not self.refuse_when(text)]

    def _answers(self, texts: list[str], outcomes: list[Any]) -> list[Any]:
        answers = iter(outcomes)
        refusal = InvalidResponseFormatError("response_format needs xgrammar: pip install xgrammar")
        return [refusal if self.refuse_when(text) else next(answers) for text in texts]


def prompt_text(record: Any) -> str:
    prompt = getattr(record, "prompt", record)
    return prompt if isinstance(prompt, str) else " ".join(message["content"] for message in prompt)


class EngineLog:
    """A replica's batcher factory that records which model answered each prompt and how many engines were loaded.

    The engines keep their own batcher defaults (`make_batcher`); only their `generate` is watched.
    """

    def __init__(self) -> None:
        self.engines: list[Any] = []
        self.answered: list[tuple[str, str]] = []  # (model, prompt text), in the order the engines were given them
        self.most_loaded = 0

    def make(self, engine: Any, settings: Any) -> Any:
        self.engines.append(engine)
        real = engine.generate

        def saw(records: list[Any]) -> None:
            self.most_loaded = max(self.most_loaded, sum(built.is_loaded for built in self.engines))
            self.answered += [(engine.model_name, prompt_text(record)) for record in records]

        async def generate_async(records: list[Any]) -> list[Any]:
            saw(records)
            return await real(records)

        def generate(records: list[Any]) -> list[Any]:
            saw(records)
            return real(records)

        engine.generate = generate_async if inspect.iscoroutinefunction(real) else generate
        return make_batcher(engine, settings)
