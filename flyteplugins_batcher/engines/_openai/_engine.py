"""`OpenAIEngine`: records answered by any OpenAI-compatible endpoint (a vLLM server, this package's own, a provider).

Each record is one HTTP call (`/v1/chat/completions`, or `/v1/completions` for a prompt sent as written), sent as
soon as it reaches the engine and the endpoint may take it: `AdaptiveConcurrency` finds how many it serves at once,
`RatePacer` keeps optional limits per minute. A call that fails for a reason that may pass (429, 5xx, a dropped
connection, a timeout) is sent again after a jittered backoff (`Retry-After` honoured), at most `max_retries`
times; any other failure (a refused key, a bad request, an answer that is not OpenAI's) fails its record at once,
with the endpoint's words. Every record gets exactly one outcome. The key (`OPENAI_API_KEY`, or the variable
`api_key_env` names: a Flyte secret mounted as it) is sent in the `Authorization` header only, and masked in
every message.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

from flyteplugins_batcher import BatcherSettings
from flyteplugins_batcher.engines._base import (
    Engine,
    LoadedModel,
    Outcome,
    stream_batcher_settings,
    with_engine_options,
)
from flyteplugins_batcher.engines._completion import Completion
from flyteplugins_batcher.engines._engine_errors import (
    ContextLengthExceededError,
    EngineConfigError,
    InvalidPromptError,
    RequestCancelledError,
    UnknownAdapterError,
    redact,
)
from flyteplugins_batcher.engines._openai._pacing import INITIAL_CONCURRENCY, AdaptiveConcurrency, RatePacer
from flyteplugins_batcher.engines._openai._wire import GarbledAnswerError, WireRequest, completion_of, wire_request
from flyteplugins_batcher.engines._prompts import PromptRecord, Request, approximate_tokens, describe, normalize_record

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
"""Answers that may pass on a second try: rate limits, an overloaded or restarting endpoint."""

OVERLOAD_STATUSES = frozenset({429, 503})
"""Answers that say the endpoint has too much to do: the concurrency halves."""

BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 10.0

_UNKNOWN_CONTEXT = 1 << 20
"""The context length assumed when the endpoint does not say its own (`max_model_len`): it checks it itself."""


class OpenAIEngine(Engine):
    """Answers each record with one call to an OpenAI-compatible endpoint; see the module's notes.

    Args:
        model: The model to ask for; `None`: the first the endpoint's `/v1/models` lists.
        base_url: The endpoint's API root, `/v1` included (`http://host:8000/v1`, `https://api.openai.com/v1`).
        api_key_env: The environment variable holding the key (a Flyte secret mounted as it); unset or empty:
            no key is sent.
        timeout_s: Longest one call may take before it counts as failed (and is retried).
        max_retries: Calls after the first, for a failure that may pass.
        initial_concurrency: Calls in flight to start from; `AdaptiveConcurrency` grows it.
        max_concurrency: The most calls in flight.
        requests_per_minute: A limit in calls per minute (0: none).
        tokens_per_minute: A limit in tokens per minute, each call counted as its estimated prompt tokens and
            `max_tokens` (0: none).
        **options: `generation`, `system_prompt`, `model_name`, as for every `Engine` (`lora_modules` are refused:
            the endpoint serves its adapters as models of their own).

    Example:
        ```python
        engine = create_engine("openai", base_url="http://localhost:8000/v1")  # OPENAI_API_KEY if it needs one
        with engine:
            async with engine.batcher() as batcher:
                answers = await batcher.run(["What is 2 + 2?"] * 1000)
        ```
    """

    name = "openai"

    @with_engine_options
    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 10,
        initial_concurrency: int = INITIAL_CONCURRENCY,
        max_concurrency: int = 256,
        requests_per_minute: float = 0.0,
        tokens_per_minute: float = 0.0,
        **options: Any,
    ) -> None:
        if options.get("lora_modules"):
            raise EngineConfigError("the openai engine takes no lora_modules: name an adapter the endpoint serves")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise EngineConfigError(f"base_url must be an http(s) URL like 'http://host:8000/v1', got {base_url!r}")
        if timeout_s <= 0 or max_retries < 0:
            raise ValueError(f"timeout_s must be > 0 and max_retries >= 0, got {timeout_s} and {max_retries}")
        super().__init__(**options)
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.concurrency = AdaptiveConcurrency(initial_concurrency, max_concurrency, slow_s=timeout_s / 2)
        self.pacer = RatePacer(requests_per_minute, tokens_per_minute)
        self.retries = 0
        """Calls sent again, since the engine was built."""
        self._served = ""
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}  # an httpx client per event loop

    # -- lifecycle -----------------------------------------------------------------------------

    def _load(self) -> LoadedModel:
        import httpx

        listing = self._listing(httpx)
        served = [entry.get("id") for entry in listing if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
        if self.model is None:
            if not served:
                raise EngineConfigError(f"{self.base_url}/models lists no model: name one with --model")
            self._served = served[0]
        elif self.model in served:
            self._served = self.model
        else:
            raise EngineConfigError(
                f"the endpoint {self.base_url} does not serve model {self.model!r}; it serves: {', '.join(served)}"
            )
        entry = next(entry for entry in listing if isinstance(entry, dict) and entry.get("id") == self._served)
        context = entry.get("max_model_len")
        return LoadedModel(_NoTokenizer(), context if isinstance(context, int) and context > 0 else _UNKNOWN_CONTEXT)

    def _listing(self, httpx: Any) -> list[Any]:
        """The endpoint's `/v1/models` entries; the failures a run cannot recover from, named before any record."""
        url = f"{self.base_url}/models"
        try:
            response = httpx.get(url, headers=self._headers(), timeout=min(self.timeout_s, 30.0))
        except httpx.TimeoutException:
            raise EngineConfigError(f"{url} did not answer within {min(self.timeout_s, 30.0):g} s") from None
        except httpx.HTTPError as error:
            raise EngineConfigError(f"cannot reach {url}: {self._redacted(error)}") from None
        if response.status_code in (401, 403):
            raise EngineConfigError(
                f"{url} refused the key (HTTP {response.status_code}): set {self.api_key_env} to a key it accepts "
                f"({self._redacted(response.text[:200])})"
            )
        if response.status_code == 404:
            raise EngineConfigError(f"{url} is not an OpenAI-compatible API (HTTP 404): does base_url end in /v1?")
        if response.status_code != 200:
            raise EngineConfigError(
                f"{url} answered HTTP {response.status_code}: {self._redacted(response.text[:200])}"
            )
        try:
            listing = response.json().get("data")
        except (ValueError, AttributeError):
            listing = None
        if not isinstance(listing, list):
            said = self._redacted(response.text[:200])
            raise EngineConfigError(f"{url} answered something that is not an OpenAI model list: {said!r}")
        return listing

    def _close(self) -> None:
        clients, self._clients = self._clients, {}
        for loop, client in clients.values():
            if not loop.is_closed():
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                else:
                    loop.run_until_complete(client.aclose())

    def _default_model_name(self) -> str:
        return self._served or self.model or self.name

    # -- records -------------------------------------------------------------------------------

    def estimate_tokens(self, record: PromptRecord) -> int:
        """About 4 characters per prompt token (the endpoint's tokenizer is not here) plus the tokens it may make."""
        return approximate_tokens(record) + self.generation_for(record).generated_tokens

    def check(self, record: PromptRecord) -> None:
        """Raise the `InvalidPromptError` a record that is not a prompt gets; the endpoint checks the rest."""
        self._require_loaded()
        normalize_record(record)

    def batcher_defaults(self) -> BatcherSettings:
        """Each record sent the moment it arrives (batches of one, many in flight): the engine paces the calls."""
        most = self.concurrency.most
        return stream_batcher_settings(most, most * 2 * (512 + self.generation.max_new_tokens))

    async def generate(self, records: list[PromptRecord]) -> list[Outcome]:
        """One outcome per record, in input order: its `Completion`, or the error that failed it alone."""
        self._require_loaded()
        with self._counters.model_call():
            outcomes = await asyncio.gather(*(self._answer(index, record) for index, record in enumerate(records)))
        self._counters.count_batch(outcomes, counts_as_batch=bool(records))
        return list(outcomes)

    async def _answer(self, index: int, record: PromptRecord) -> Outcome:
        generation = self.generation_for(record)
        try:
            call = wire_request(record, generation, self._served, self.system_prompt)
        except InvalidPromptError as error:
            return self._invalid(index, record, str(error))
        failure: Exception = RuntimeError("no call was made")
        for attempt in range(self.max_retries + 1):
            if isinstance(record, Request) and record.cancelled:
                return RequestCancelledError(f"{self.name}: {describe(index, record)}: cancelled")
            outcome, retry_after_s = await self._call(index, record, call, logprobs=generation.logprobs is not None)
            if not isinstance(outcome, _Retryable):
                return outcome
            failure = outcome.error
            if attempt < self.max_retries:
                self.retries += 1
                await asyncio.sleep(backoff_s(attempt, retry_after_s))
        return type(failure)(f"{failure} (after {self.max_retries + 1} attempts)")

    async def _call(
        self, index: int, record: PromptRecord, call: WireRequest, *, logprobs: bool
    ) -> tuple[Outcome | _Retryable, float | None]:
        """One HTTP call: its outcome (or a failure worth retrying) and the `Retry-After` it asked for."""
        import httpx

        await self.pacer.take(call.estimated_tokens)
        await self.concurrency.acquire()
        was_full = self.concurrency.in_flight >= int(self.concurrency.limit)
        started = time.monotonic()
        label = f"{self.name}: {describe(index, record)}"
        try:
            response = await self._client().post(call.path, json=call.body)
        except httpx.TimeoutException:
            await self.concurrency.overloaded(sent_at=started, was_full=was_full)
            return _Retryable(TimeoutError(f"{label}: no answer within {self.timeout_s:g} s")), None
        except httpx.HTTPError as error:
            return _Retryable(ConnectionError(f"{label}: the call failed: {self._redacted(error)}")), None
        finally:
            await self.concurrency.release()
        status, retry_after_s = response.status_code, retry_after(response.headers.get("retry-after"))
        if status == 200:
            outcome = self._completion(label, response, chat=call.path == "/chat/completions", logprobs=logprobs)
            tokens = outcome.completion_tokens if isinstance(outcome, Completion) else 0
            await self.concurrency.answered(time.monotonic() - started, tokens, was_full=was_full)
            return outcome, None
        said = self._redacted(" ".join(response.text[:300].split()))
        if status in OVERLOAD_STATUSES:
            await self.concurrency.overloaded(retry_after_s, sent_at=started, was_full=was_full)
        if status in RETRYABLE_STATUSES:
            return _Retryable(ConnectionError(f"{label}: the endpoint answered HTTP {status}: {said}")), retry_after_s
        return refusal(label, status, said, self.api_key_env), None

    def _completion(self, label: str, response: Any, *, chat: bool, logprobs: bool) -> Outcome:
        try:
            return completion_of(response.json(), chat=chat, logprobs=logprobs)
        except (ValueError, TypeError, KeyError) as error:
            said = self._redacted(" ".join(response.text[:200].split()))
            reason = str(error) if isinstance(error, GarbledAnswerError) else f"not JSON: {said!r}"
            return GarbledAnswerError(f"{label}: the endpoint's answer is not an OpenAI response ({reason})")

    # -- HTTP ----------------------------------------------------------------------------------

    def _client(self) -> Any:
        """The running loop's client (an `httpx.AsyncClient` is bound to the loop it first ran on)."""
        import httpx

        loop = asyncio.get_running_loop()
        held = self._clients.get(id(loop))
        if held is None or held[0] is not loop:
            most = self.concurrency.most
            client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self._headers(),
                timeout=self.timeout_s,
                limits=httpx.Limits(max_connections=most, max_keepalive_connections=most),
            )
            held = self._clients[id(loop)] = (loop, client)
        return held[1]

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "").strip()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _redacted(self, said: object) -> str:
        return redact(str(said), os.environ.get(self.api_key_env))


class _Retryable:
    """A call's failure that may pass on another try."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class _NoTokenizer:
    """The stand-in tokenizer of an engine whose model is elsewhere: about 4 characters per token, no template."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [0] * (len(text) // 4 + 1)


def refusal(label: str, status: int, said: str, key_variable: str) -> Exception:
    """The error a call the endpoint refused for good fails its record with (never retried)."""
    if status in (401, 403):
        return PermissionError(f"{label}: the endpoint refused the key (HTTP {status}; {key_variable}): {said}")
    if status == 404 and "model" in said.lower():
        return UnknownAdapterError(f"{label}: the endpoint does not serve the model it asked for: {said}")
    if status in (400, 422):
        lowered = said.lower()
        kind = ContextLengthExceededError if "context length" in lowered or "maximum" in lowered else InvalidPromptError
        return kind(f"{label}: the endpoint refused the request (HTTP {status}): {said}")
    return RuntimeError(f"{label}: the endpoint answered HTTP {status}: {said}")


def retry_after(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks for (a number of seconds; an HTTP date is read as 1 s), or `None`."""
    if not value:
        return None
    try:
        return max(0.0, min(float(value), 600.0))
    except ValueError:
        return 1.0


def backoff_s(attempt: int, retry_after_s: float | None = None) -> float:
    """The wait before try `attempt + 2`: full jitter over an exponential bound, at least `Retry-After`."""
    jittered = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
    return max(jittered, retry_after_s or 0.0)
