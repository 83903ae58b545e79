"""The engine interface: a batch of prompt records in, completions in the same order out."""

from __future__ import annotations

import abc
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from flyteplugins_batcher._errors import short_repr
from flyteplugins_batcher._records import Prompt

if TYPE_CHECKING:
    from flyteplugins_batcher._token_batcher import TokenBatcher

ChatMessages = Sequence[Mapping[str, str]]
"""A chat conversation: `[{"role": "user", "content": "..."}, ...]`."""

PromptRecord = str | Prompt | ChatMessages
"""What an engine accepts per record: plain text, a `Prompt`, or chat messages."""

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationConfig:
    """Generation settings shared by every engine.

    Args:
        max_new_tokens: Upper bound on generated tokens per record.
        temperature: 0 means greedy decoding (deterministic); > 0 samples.
        top_p: Nucleus-sampling mass, used only when sampling.
        stop: Strings that end a completion; the stop string is not included in the text.
        seed: Seed for sampling, so that sampled runs can be repeated.

    Example:
        ```python
        config = GenerationConfig(max_new_tokens=128, stop=("\\n\\n",))
        ```
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0


@dataclass(frozen=True)
class Completion:
    """One record's generated text and token accounting.

    Attributes:
        text: The generated text, without the prompt and without a matched stop string.
        prompt_tokens: Tokens in the rendered prompt (after the chat template).
        completion_tokens: Tokens generated.
        finish_reason: `"stop"` when EOS or a stop string ended generation, `"length"` when
            `max_new_tokens` did.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason


class InvalidPromptError(ValueError):
    """A record an engine cannot run (empty, too long for the context, wrong type).

    Engines return it in the record's result slot, so only that record's future fails.
    """


@dataclass
class EngineStats:
    """Counters an engine keeps across the batches it ran.

    Attributes:
        batches: Calls to `generate` with at least one valid record.
        records: Records that produced a completion.
        failed_records: Records answered with an error instead of a completion.
        prompt_tokens: Real prompt tokens across all completions.
        completion_tokens: Generated tokens across all completions.
        real_tokens: Non-padding token positions the engine computed over (prompt + generated).
        padded_tokens: All token positions computed over, padding included.
        generate_time_s: Seconds spent inside the model.
    """

    batches: int = 0
    records: int = 0
    failed_records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    generate_time_s: float = 0.0

    @property
    def padding_efficiency(self) -> float:
        """Real tokens / padded tokens (1.0 means no compute was spent on padding)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    @property
    def completion_tokens_per_s(self) -> float:
        """Generated tokens per second of model time."""
        return self.completion_tokens / self.generate_time_s if self.generate_time_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        """All counters plus the derived rates, as plain numbers."""
        return {
            **asdict(self),
            "padding_efficiency": self.padding_efficiency,
            "completion_tokens_per_s": self.completion_tokens_per_s,
        }


@dataclass
class _EngineState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: bool = False


class Engine(abc.ABC):
    """Turns a batch of prompt records into completions, in input order.

    An engine is loaded once per process (it owns the model) and shared by every producer
    through a batcher. `generate` takes a list of records (`str`, `Prompt`, or chat messages)
    and returns one entry per record: a `Completion`, or an `Exception` for a record that
    cannot run, which fails only that record's future in the batcher.

    Subclasses implement `_load`, `_close`, `context_length`, `tokenize`, `_has_chat_template`,
    `_apply_chat_template` and `generate`; `generate` may be a plain `def` (the batcher runs it
    in a worker thread) or an `async def`.

    Args:
        generation: Generation settings; defaults to `GenerationConfig()`.
        system_prompt: Prepended as a system message when the chat template is used.
        chat_template: Render records through the tokenizer's chat template. `None` means
            "when the tokenizer has one".

    Example:
        ```python
        engine = create_engine("transformers")
        engine.load()
        async with engine.batcher() as batcher:
            answers = await batcher.run(["What is 2 + 2?"])
        ```
    """

    name: str = "engine"

    def __init__(
        self,
        *,
        generation: GenerationConfig | None = None,
        system_prompt: str | None = None,
        chat_template: bool | None = None,
    ) -> None:
        self.generation = generation or GenerationConfig()
        self.system_prompt = system_prompt
        self.chat_template = chat_template
        self.stats = EngineStats()
        self._state = _EngineState()

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def is_loaded(self) -> bool:
        """Whether `load()` has completed and `close()` has not been called since."""
        return self._state.loaded

    def load(self) -> None:
        """Load the model and tokenizer. Idempotent and thread-safe; blocking."""
        with self._state.lock:
            if not self._state.loaded:
                self._load()
                self._state.loaded = True

    def close(self) -> None:
        """Release the model. Idempotent; the engine can be loaded again afterwards."""
        with self._state.lock:
            if self._state.loaded:
                self._close()
                self._state.loaded = False

    def __enter__(self) -> Engine:
        self.load()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abc.abstractmethod
    def _load(self) -> None: ...

    def _close(self) -> None:  # noqa: B027 - optional hook: engines with nothing to free skip it
        """Free what `_load` acquired."""

    # -- prompts and tokens --------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def context_length(self) -> int:
        """The model's maximum sequence length (prompt + generated tokens)."""

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of an already-rendered prompt, as the model will see them."""

    def render(self, record: PromptRecord) -> str:
        """The exact prompt text for a record (chat template applied where configured).

        Raises:
            InvalidPromptError: The record is not a string, `Prompt` or chat messages, or is empty,
                or it is chat messages and the model has no chat template.
        """
        content = normalize_record(record)
        if self.uses_chat_template():
            messages = [{"role": "user", "content": content}] if isinstance(content, str) else list(content)
            if self.system_prompt and messages[0]["role"] != "system":
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            return self._apply_chat_template(messages)
        if not isinstance(content, str):
            raise InvalidPromptError(f"{self.name}: chat messages need a chat template, and this model has none")
        return f"{self.system_prompt}\n\n{content}" if self.system_prompt else content

    def uses_chat_template(self) -> bool:
        """Whether records are rendered through the chat template (`chat_template`, else "if it has one")."""
        return self.chat_template if self.chat_template is not None else self._has_chat_template()

    @abc.abstractmethod
    def _has_chat_template(self) -> bool:
        """Whether the tokenizer carries a chat template."""

    @abc.abstractmethod
    def _apply_chat_template(self, messages: list[Mapping[str, str]]) -> str:
        """Render chat messages to prompt text, with the assistant turn opened."""

    def prompt_tokens(self, record: PromptRecord) -> int:
        """Number of prompt tokens the model will see for `record`."""
        return len(self.tokenize(self.render(record)))

    def estimate_tokens(self, record: PromptRecord) -> int:
        """Token cost of a record for a `TokenBatcher` budget: prompt tokens + `max_new_tokens`.

        Prompt tokens come from the model's tokenizer; only when there is none to ask (the engine
        cannot tokenize) does it fall back to about 4 characters per token. Never raises: a record
        that cannot be rendered costs 1 token and fails later, alone, with a clear error from
        `generate`.
        """
        try:
            return self.prompt_tokens(record) + self.generation.max_new_tokens
        except InvalidPromptError:
            return 1
        except Exception:
            return approximate_tokens(record) + self.generation.max_new_tokens

    @abc.abstractmethod
    def generate(self, records: list[PromptRecord]) -> list[Completion | Exception]:
        """Generate completions for a batch; one entry per record, in input order."""

    # -- batching ------------------------------------------------------------------------------

    def batcher_defaults(self) -> dict[str, Any]:
        """`TokenBatcher` settings that suit this engine; `batcher(**overrides)` starts from them."""
        return {}

    def batcher(self, **overrides: Any) -> TokenBatcher[PromptRecord, Completion]:
        """A `TokenBatcher` that feeds this engine, budgeted with the engine's own token counts.

        Args:
            **overrides: Any `TokenBatcher` keyword (for example `target_batch_tokens`).
        """
        from flyteplugins_batcher._token_batcher import TokenBatcher

        options: dict[str, Any] = {
            "inference_fn": self.generate,
            "token_estimator": self.estimate_tokens,
            **self.batcher_defaults(),
            **overrides,
        }
        return TokenBatcher(**options)


def approximate_tokens(record: object) -> int:
    """About 4 characters per token, for when no tokenizer can count (as `Prompt.estimate_tokens`)."""
    try:
        content = normalize_record(record)
    except InvalidPromptError:
        return 1
    text = content if isinstance(content, str) else "".join(message["content"] for message in content)
    return len(text) // 4 + 1


def normalize_record(record: object) -> str | list[Mapping[str, str]]:
    """Validate a prompt record and return its text, or its chat messages as a list.

    Raises:
        InvalidPromptError: With a message that names the record.
    """
    if isinstance(record, Prompt):
        record = record.text
    if isinstance(record, str):
        if not record.strip():
            raise InvalidPromptError("empty prompt: the record has no text")
        return record
    if isinstance(record, Sequence) and not isinstance(record, (bytes, bytearray)):
        messages = list(record)
        if not messages:
            raise InvalidPromptError("empty prompt: the chat record has no messages")
        for message in messages:
            if not isinstance(message, Mapping) or not isinstance(message.get("content"), str) or "role" not in message:
                raise InvalidPromptError(
                    f"chat messages must be mappings with 'role' and string 'content'; got {short_repr(message)}"
                )
        return messages
    raise InvalidPromptError(
        f"a prompt record must be a str, a Prompt, or a list of chat messages; got {type(record).__name__}: "
        f"{short_repr(record)}"
    )
