"""The engine interface and its one pipeline: render, tokenize, validate, run, merge, count.

Every engine goes through the same steps for a batch of records, here: each record is rendered
(chat template, system prompt), tokenized with the model's tokenizer and checked against the
context; a record that cannot run gets an `InvalidPromptError` in its place among the results and never reaches
the model; the valid ones go to the engine's model call (`_run`); the results are merged back in
input order and counted. A `Request` cancelled before it runs gets a `RequestCancelledError` and
never reaches the model either; one cancelled while it runs is stopped by the engines that can
(see each engine's notes) and answered with one too. An engine implements only its loading (`_load`, which returns the
tokenizer and context length as a `LoadedModel`), its model call and, optionally, `_close`.
`BatchEngine` runs the model call in the calling thread (the batcher gives it a worker thread);
`StreamingEngine` awaits it.
"""

from __future__ import annotations

import abc
import functools
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from flyteplugins_batcher import BatcherOptions, BatcherSettings
from flyteplugins_batcher.engines._completion import Completion
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._engine_errors import (
    ContextLengthExceededError,
    EngineNotLoadedError,
    InvalidPromptError,
    RequestCancelledError,
    UnknownAdapterError,
)
from flyteplugins_batcher.engines._engine_stats import CountedEngine, EngineCounters
from flyteplugins_batcher.engines._object_store import local_adapters
from flyteplugins_batcher.engines._prompts import (
    PreparedPrompt,
    PromptRecord,
    Request,
    approximate_tokens,
    describe,
    normalize_record,
    prompt_prefix_key,
)
from flyteplugins_batcher.engines._reasoning import ReasoningSupport
from flyteplugins_batcher.engines._structured import check_generation

if TYPE_CHECKING:
    from flyteplugins_batcher import TokenBatcher

InitT = TypeVar("InitT", bound=Callable[..., None])

_TOKENIZE_CACHE_SIZE = 8192
"""Rendered prompts whose token ids are kept: the batcher's estimate and `generate` each tokenize a record."""

Outcome = Completion | Exception
"""One record's result: its completion, or the error that failed it alone."""


@dataclass(frozen=True)
class LoadedModel:
    """What an engine's `_load` hands the shared pipeline once its model is ready.

    Attributes:
        tokenizer: A Hugging Face-style tokenizer (`encode(text, add_special_tokens=...)`, and
            `chat_template`/`apply_chat_template` where the model has one); it counts tokens exactly
            as the model sees them.
        context_length: The model's maximum sequence length (prompt + generated tokens).

    Example:
        ```python
        def _load(self) -> LoadedModel:
            self._model = load_my_model()
            return LoadedModel(self._model.tokenizer, context_length=4096)
        ```
    """

    tokenizer: Any
    context_length: int


class Engine(CountedEngine, ReasoningSupport, abc.ABC):
    """Turns a batch of prompt records into completions, in input order.

    An engine is loaded once per process (it owns the model) and shared by every producer
    through a batcher. `generate` takes a list of records (`str`, `Prompt`, chat messages or
    `Request`) and returns one entry per record: a `Completion`, or an `Exception` for a record
    that cannot run, which fails only that record's future in the batcher.

    Subclasses implement `_load` (which returns a `LoadedModel`: the tokenizer and the context
    length), optionally `_close`, and the model call (`BatchEngine._run` or `StreamingEngine._run`);
    everything else is shared. Engines that split a batch into passes, or schedule sequences
    themselves, count those in `self._counters` (an `EngineCounters`).

    Args:
        generation: Default generation settings; a `Request` may bring its own.
        system_prompt: Prepended as a system message when the chat template is used.
        chat_template: Render records through the tokenizer's chat template. `None` means
            "when the tokenizer has one".
        model_name: The name results carry (for example in an OpenAI-style output line); by
            default the model reference the engine was given.
        lora_modules: LoRA adapters by name (name -> PEFT adapter folder, or its `s3://` prefix, fetched at load): a
            `Request` whose `adapter` names one generates with it (engines that cannot load adapters refuse them).
        reasoning_parser: Take a reasoning model's thinking out of each answer's text, by vLLM's
            `--reasoning-parser` names (`ReasoningSupport`); an unknown name fails `load()`.

    Example:
        ```python
        engine = create_engine("transformers")
        engine.load()
        async with engine.batcher() as batcher:
            answers = await batcher.run(["What is 2 + 2?"])
        ```
    """

    name: str = "engine"
    counts_passes: bool = False
    """Engines that split a batch into model passes count those (`EngineCounters.count_pass`) as batches."""

    def __init__(
        self,
        *,
        generation: GenerationConfig | None = None,
        system_prompt: str | None = None,
        chat_template: bool | None = None,
        model_name: str | None = None,
        lora_modules: Mapping[str, str] | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        self.generation = generation or GenerationConfig()
        self.reasoning_parser = reasoning_parser or None
        self.system_prompt = system_prompt
        self.chat_template = chat_template
        self._model_name = model_name
        self.lora_modules: dict[str, str] = dict(lora_modules or {})
        self._lifecycle_lock = threading.Lock()
        self._loaded = False
        self._tokenizer: Any = None  # the `LoadedModel`'s, while loaded
        self._context_length = 0
        self._encoders: dict[bool, Callable[[str], tuple[int, ...]]] = {}  # by "rendered through a template"
        self._counters = EngineCounters()

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def is_loaded(self) -> bool:
        """Whether `load()` has completed and `close()` has not been called since."""
        return self._loaded

    @property
    def is_healthy(self) -> bool:
        """Whether the engine can still run (an engine whose process died cannot)."""
        return self._loaded

    @property
    def model_name(self) -> str:
        """The name of the model this engine serves."""
        return self._model_name or self._default_model_name()

    def _default_model_name(self) -> str:
        return self.name

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters a `Request` may name (`lora_modules`' names), in the order given."""
        return tuple(self.lora_modules)

    def load(self) -> None:
        """Load the model and tokenizer. Idempotent and thread-safe; blocking (`stats.load_time_s` times it)."""
        with self._lifecycle_lock:
            if self._loaded:
                return
            started, self.lora_modules = time.perf_counter(), local_adapters(self.lora_modules)  # a bucket's: fetched
            loaded = self._load()
            self._tokenizer, self._context_length = loaded.tokenizer, loaded.context_length
            self._start_reasoning(loaded.tokenizer, on_error=self._close)
            # A template writes its own special tokens (BOS); a raw prompt gets them from the tokenizer.
            self._encoders = {
                templated: _cached_encoder(loaded.tokenizer, add_special_tokens=not templated)
                for templated in (True, False)
            }
            self._loaded = True
            self._counters.loaded_in(time.perf_counter() - started)

    def close(self) -> None:
        """Release the model. Idempotent; the engine can be loaded again afterwards."""
        with self._lifecycle_lock:
            if self._loaded:
                self._loaded = False
                self._encoders = {}
                self._close()
                self._tokenizer = self._reasoning = None

    def __enter__(self) -> Engine:
        self.load()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abc.abstractmethod
    def _load(self) -> LoadedModel:
        """Load the model; return its tokenizer and context length."""

    def _close(self) -> None:
        """Free what `_load` acquired."""

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise EngineNotLoadedError(f"{self.name}: the engine is not loaded; call load() first (or use `with`)")

    # -- prompts and tokens --------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        """The model's maximum sequence length (prompt + generated tokens).

        Raises:
            EngineNotLoadedError: Before `load()`.
        """
        self._require_loaded()
        return self._context_length

    def tokenize(self, text: str) -> list[int]:
        """Token ids of an already-rendered prompt, as the model will see them.

        Special tokens (BOS) are added only when no chat template rendered the prompt, since a
        template writes its own.

        Raises:
            EngineNotLoadedError: Before `load()`.
        """
        self._require_loaded()
        return list(self._encoders[self.uses_chat_template()](text))

    def render(self, record: PromptRecord) -> str:
        """The exact prompt text for a record (chat template applied where configured).

        A `Request` with `chat_template=False` is used exactly as written, with no template and no
        system prompt (OpenAI's `/v1/completions`).

        Raises:
            InvalidPromptError: The record is not a str, `Prompt`, chat messages or `Request`, or is
                empty, or it is chat messages and the model has no chat template.
        """
        content = normalize_record(record)
        if self._templated(record):
            messages = [{"role": "user", "content": content}] if isinstance(content, str) else list(content)
            if self.system_prompt and messages[0]["role"] != "system":
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            return apply_template(self._tokenizer, messages, record if isinstance(record, Request) else None)
        if not isinstance(content, str):
            raise InvalidPromptError("chat messages need a chat template, and this model has none")
        as_written = isinstance(record, Request) and record.chat_template is False
        return f"{self.system_prompt}\n\n{content}" if self.system_prompt and not as_written else content

    def uses_chat_template(self) -> bool:
        """Whether records are rendered through the chat template (`chat_template`, else "if it has one")."""
        if self.chat_template is not None:
            return self.chat_template
        return bool(getattr(self._tokenizer, "chat_template", None))

    def _templated(self, record: PromptRecord) -> bool:
        own = record.chat_template if isinstance(record, Request) else None
        return self.uses_chat_template() if own is None else own and self.uses_chat_template()

    def prompt_ids(self, record: PromptRecord) -> list[int]:
        """The token ids the model will see for `record`: rendered, then tokenized as its rendering needs."""
        self._require_loaded()
        return list(self._encoders[self._templated(record)](self.render(record)))

    def prompt_tokens(self, record: PromptRecord) -> int:
        """Number of prompt tokens the model will see for `record`."""
        return len(self.prompt_ids(record))

    def generation_for(self, record: object) -> GenerationConfig:
        """The settings that apply to a record: its own (a `Request`'s), else the engine's."""
        if isinstance(record, Request) and record.generation is not None:
            return record.generation
        return self.generation

    def estimate_tokens(self, record: PromptRecord) -> int:
        """Token cost of a record for a `TokenBatcher` budget: prompt tokens + `max_new_tokens` per decoded sample.

        Prompt tokens come from the model's tokenizer; only when there is none to ask (not loaded
        yet) does it fall back to about 4 characters per token. Never raises: a record that cannot
        be rendered costs 1 token and fails later, alone, with a clear error from `generate`.
        """
        try:
            return self.prompt_tokens(record) + self.generation_for(record).generated_tokens
        except InvalidPromptError:
            return 1
        except Exception:
            return approximate_tokens(record) + self.generation_for(record).generated_tokens

    # -- the pipeline --------------------------------------------------------------------------

    @abc.abstractmethod
    def generate(self, records: list[PromptRecord]) -> list[Outcome] | Awaitable[list[Outcome]]:
        """Generate completions for a batch; one entry per record, in input order."""

    def check(self, record: PromptRecord) -> None:
        """Raise the `InvalidPromptError` that `generate` would answer `record` with; nothing when it can run.

        A server checks a streamed request so before it sends the response's headers, so that a
        prompt that cannot run is an HTTP error there too.

        Raises:
            InvalidPromptError: The record cannot run (too long for the context, a template that
                rejects it, settings this engine cannot honour, an unknown adapter).
            EngineNotLoadedError: Before `load()`.
        """
        self._require_loaded()
        checked = _checked(self, 0, record)
        if isinstance(checked, InvalidPromptError):
            raise checked

    def _prepare(self, records: Sequence[PromptRecord]) -> tuple[list[PreparedPrompt], list[Outcome | None]]:
        """Render, tokenize and check every record: the valid ones to run, and a place per record."""
        self._require_loaded()
        prepared: list[PreparedPrompt] = []
        results: list[Outcome | None] = [None] * len(records)
        for index, record in enumerate(records):
            if isinstance(record, Request) and record.cancelled:  # its caller left before it ran
                results[index] = RequestCancelledError(f"{self.name}: {describe(index, record)}: cancelled")
                continue
            checked = _checked(self, index, record)
            if isinstance(checked, InvalidPromptError):
                results[index] = checked
                continue
            prepared.append(_prepared(index, record, *checked))
        return prepared, results

    def _check_generation(self, generation: GenerationConfig) -> None:
        """Raise `InvalidPromptError` for settings this engine cannot honour (a schema that does not compile)."""
        check_generation(generation)

    def _invalid(self, index: int, record: object, reason: str, kind: type = InvalidPromptError) -> InvalidPromptError:
        return kind(f"{self.name}: {describe(index, record)}: {reason}")

    def _merge(
        self, prepared: list[PreparedPrompt], outcomes: Sequence[Outcome], results: list[Outcome | None]
    ) -> list[Outcome]:
        """Put each valid record's outcome in its place (its reasoning split out by a parser), and count the batch."""
        for prompt, outcome in zip(prepared, outcomes, strict=True):
            results[prompt.index] = self._split_reasoning(outcome)
        self._counters.count_batch(results, counts_as_batch=bool(prepared) and not self.counts_passes)
        return results  # type: ignore[return-value]

    # -- batching ------------------------------------------------------------------------------

    def batcher_defaults(self) -> BatcherSettings:
        """`TokenBatcher` settings that suit this engine; `batcher(**overrides)` starts from them."""
        return BatcherSettings()

    def batcher(self, **overrides: Any) -> TokenBatcher[PromptRecord, Completion]:
        """A `TokenBatcher` that feeds this engine, budgeted with the engine's own token counts.

        With `grouping="by_prefix"`, prompts that begin alike go together (`prompt_prefix_key`).

        Args:
            **overrides: Any `TokenBatcher` keyword (for example `target_batch_tokens`,
                `grouping="by_prefix"`), applied over `batcher_defaults()`; a misspelt one raises
                `TypeError` here.
        """
        from flyteplugins_batcher import TokenBatcher

        options = BatcherOptions.parse(overrides, base=self.batcher_defaults())
        return TokenBatcher.from_settings(
            self.generate,
            options.settings,
            cost_estimator=options.cost_estimator or self.estimate_tokens,
            name=options.name,
            prefix_key=options.prefix_key or prompt_prefix_key,
        )


def engine_options() -> list[inspect.Parameter]:
    """The keywords every engine takes, written once: `Engine.__init__`'s (`generation`, `system_prompt`, ...)."""
    parameters = inspect.signature(Engine.__init__).parameters.values()
    return [parameter for parameter in parameters if parameter.kind is parameter.KEYWORD_ONLY]


def take_engine_options(arguments: dict[str, Any]) -> dict[str, Any]:
    """Take the keywords every engine takes (`engine_options`) out of `arguments`, for `Engine.__init__`."""
    return {option.name: arguments.pop(option.name) for option in engine_options() if option.name in arguments}


def with_engine_options(init: InitT) -> InitT:
    """Decorate an engine's `__init__` that hands `Engine`'s keywords on to it: its signature shows them.

    The subclass takes them in its `**options` (replaced by them in its signature), or among further
    keywords of its own (vLLM's `**engine_args`, kept after them), and passes them to `super().__init__`.

    Example:
        ```python
        @with_engine_options
        def __init__(self, model: str, *, device: str = "auto", **options: Any) -> None:
            super().__init__(**options)
        ```
    """
    signature = inspect.signature(init)
    own = [parameter for parameter in signature.parameters.values() if parameter.kind is not parameter.VAR_KEYWORD]
    rest = [
        parameter
        for parameter in signature.parameters.values()
        if parameter.kind is parameter.VAR_KEYWORD and parameter.name != "options"
    ]
    init.__signature__ = signature.replace(parameters=[*own, *engine_options(), *rest])  # type: ignore[attr-defined]
    return init


def _checked(
    engine: Engine, index: int, record: PromptRecord
) -> tuple[list[int], GenerationConfig] | InvalidPromptError:
    """A record's token ids and settings, or the error it cannot run for (naming it as record `index`)."""
    try:
        generation = engine.generation_for(record)
        token_ids = engine.prompt_ids(record)
        engine._check_generation(generation)
        check_adapter(record, engine.lora_modules, engine.name)
    except InvalidPromptError as error:
        return engine._invalid(index, record, str(error), type(error))
    except Exception as error:  # a chat template can reject a conversation (e.g. roles out of order)
        invalid = engine._invalid(index, record, f"cannot render the prompt: {error}")
        invalid.__cause__ = error
        return invalid
    context = engine.context_length
    if len(token_ids) + generation.max_new_tokens > context:
        return engine._invalid(
            index, record, _too_long(len(token_ids), generation.max_new_tokens, context), ContextLengthExceededError
        )
    return token_ids, generation


def _cached_encoder(tokenizer: Any, *, add_special_tokens: bool) -> Callable[[str], tuple[int, ...]]:
    """`tokenizer.encode`, cached, one call at a time (a Rust tokenizer must not run in two threads at once)."""
    lock = threading.Lock()

    @functools.lru_cache(maxsize=_TOKENIZE_CACHE_SIZE)
    def encode(text: str) -> tuple[int, ...]:
        with lock:
            return tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens))

    return encode


def _prepared(index: int, record: PromptRecord, token_ids: list[int], generation: GenerationConfig) -> PreparedPrompt:
    if isinstance(record, Request) and (
        record.cancellation is not None or record.on_delta is not None or record.adapter is not None
    ):
        return PreparedPrompt(index, token_ids, generation, record.cancellation, record.on_delta, record.adapter)
    return PreparedPrompt(index, token_ids, generation)


def apply_template(tokenizer: Any, messages: list[Mapping[str, Any]], request: Request | None) -> str:
    """The chat template over `messages`, with the request's tools and template keywords (as vLLM renders them)."""
    options: dict[str, Any] = {"add_generation_prompt": True}
    if request is not None:
        if request.tools:
            options["tools"] = [dict(tool) for tool in request.tools]
        options.update(request.template_kwargs or {})
    return str(tokenizer.apply_chat_template(template_messages(messages), tokenize=False, **options))


def check_adapter(record: PromptRecord, lora_modules: Mapping[str, str], engine: str) -> None:
    """Raise `UnknownAdapterError` for a record naming an adapter the engine was not given."""
    adapter = record.adapter if isinstance(record, Request) else None
    if adapter is not None and adapter not in lora_modules:
        known = ", ".join(map(repr, lora_modules)) or "none (start it with lora_modules)"
        raise UnknownAdapterError(f"unknown LoRA adapter {adapter!r}; the {engine} engine has {known}")


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates take them: an assistant's tool call `arguments` as an object, not JSON text.

    As vLLM hands them to a template (Transformers' convention): text that is not a JSON object becomes `{}`.

    Example:
        ```python
        call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        [message] = template_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])
        assert message["tool_calls"][0]["function"]["arguments"] == {"x": 1}
        ```
    """
    shaped = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            shaped.append(dict(message))
            continue
        shaped.append({**message, "tool_calls": [_with_object_arguments(call) for call in calls]})
    return shaped


def _with_object_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = {}
    function["arguments"] = arguments if isinstance(arguments, Mapping) else {}
    return {**call, "function": function}


def _too_long(prompt_tokens: int, max_new_tokens: int, context: int) -> str:
    needed = prompt_tokens + max_new_tokens
    return (
        f"prompt is too long: {prompt_tokens} prompt tokens + max_new_tokens {max_new_tokens} = {needed} > "
        f"context length {context}"
    )


class BatchEngine(Engine):
    """An engine whose model call blocks: `generate` is a plain `def` (the batcher runs it in a worker thread)."""

    def generate(self, records: list[PromptRecord]) -> list[Outcome]:
        """Complete a batch; one `Completion` (or `InvalidPromptError`) per record, in input order."""
        prepared, results = self._prepare(records)
        outcomes: list[Outcome] = []
        if prepared:
            with self._counters.model_call():
                outcomes = self._run(prepared)
        return self._merge(prepared, outcomes, results)

    @abc.abstractmethod
    def _run(self, prompts: list[PreparedPrompt]) -> list[Outcome]:
        """The model call: one outcome per prepared prompt, in order."""


class StreamingEngine(Engine):
    """An engine whose model call is awaited: `generate` is a coroutine that serves records as they come."""

    async def generate(self, records: list[PromptRecord]) -> list[Outcome]:
        """Complete a batch; one `Completion` (or `InvalidPromptError`) per record, in input order."""
        prepared, results = self._prepare(records)
        outcomes: list[Outcome] = []
        if prepared:
            with self._counters.model_call():
                outcomes = await self._run(prepared)
        return self._merge(prepared, outcomes, results)

    @abc.abstractmethod
    async def _run(self, prompts: list[PreparedPrompt]) -> list[Outcome]:
        """The model call: one outcome per prepared prompt, in order."""


STREAM_OVERCOMMIT = 2
"""Estimated tokens in flight may reach this multiple of the KV cache: estimates count every record's
full `max_new_tokens` although most stop earlier, and the engine needs a waiting queue to refill
slots the moment sequences finish."""


def stream_batcher_settings(
    max_num_seqs: int, kv_cache_tokens: int, max_model_len: int | None = None
) -> BatcherSettings:
    """Batches of one record dispatched at once, up to `max(1024, 4 * max_num_seqs)` in flight.

    Each record reaches the engine the moment it arrives, and the engine's own continuous batching
    fills its slots. Estimated tokens in flight are bounded at `STREAM_OVERCOMMIT` KV caches, but
    never below `STREAM_OVERCOMMIT * max_num_seqs` records of the longest estimate there can be
    (`max_model_len`): an estimate counts a record's whole `max_new_tokens`, so with a large
    `max_tokens` (2,048 against a 442k-token cache) the KV bound alone would admit 400 records to
    an engine with 1,024 slots. The engine manages its cache itself (it preempts when real outputs
    fill it); the bound only keeps the rest of the queue here rather than in the engine's.
    """
    floor = max_num_seqs * max_model_len if max_model_len else 0
    return BatcherSettings(
        max_batch_size=1,
        batch_timeout_s=0.0,
        max_concurrent_batches=max(1024, 4 * max_num_seqs),
        max_in_flight_cost=STREAM_OVERCOMMIT * max(kv_cache_tokens, floor),
    )
