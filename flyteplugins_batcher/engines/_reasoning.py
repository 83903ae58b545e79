"""Reasoning parsers: the thinking a reasoning model writes before its answer, taken out of the answer's text.

An engine given `reasoning_parser` (vLLM's `--reasoning-parser`) splits each sample's text into its
reasoning (`Sample.reasoning`, answered as `message.reasoning_content`) and its answer (`Sample.text`),
and counts the reasoning's tokens (`Sample.reasoning_tokens`, answered as
`usage.completion_tokens_details.reasoning_tokens`). The vLLM engine uses vLLM's own parsers (every
name vLLM registers, `vllm_reasoning_parser`); the other engines those of the models that mark
their reasoning with tags (`TAG_PARSERS`, by vLLM's names), read as vLLM reads them: the text after
the start tag (when there is one: a chat template may have written it into the prompt) up to the
end tag is the reasoning, the rest the answer; a text without the end tag is all reasoning (the
model was cut off while thinking). Reasoning tokens are the generated tokens between the tags.

A response format constrains the whole answer from its first token: with one, the model writes no
reasoning, and the parser finds none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from flyteplugins_batcher.engines._completion import Completion, Sample
from flyteplugins_batcher.engines._engine_errors import EngineConfigError

TAG_PARSERS: dict[str, tuple[str, str]] = {
    "deepseek_r1": ("<think>", "</think>"),
    "qwen3": ("<think>", "</think>"),
}
"""The reasoning parsers every engine has, by vLLM's names: their start and end tags."""


class ReasoningParser(Protocol):
    """Splits a sample's text into its reasoning and its answer, and counts the reasoning's tokens."""

    def split(self, sample: Sample) -> Sample:
        """The sample with its reasoning taken out of `text` into `reasoning`, and `reasoning_tokens` counted."""


class ReasoningSupport:
    """An engine's reasoning parser: made with the tokenizer at load, splitting each completion's samples.

    `Engine` mixes it in: an engine given `reasoning_parser` makes it on `load()` (a tag parser; the vLLM
    engine overrides `make_reasoning_parser` with vLLM's) and splits every completion before it is answered.

    Example:
        ```python
        engine = create_engine("transformers", reasoning_parser="deepseek_r1")
        engine.load()
        [completion] = engine.generate(["Think, then answer: 2 + 2?"])
        print(completion.samples[0].reasoning, completion.text)
        ```
    """

    reasoning_parser: str | None = None
    _reasoning: ReasoningParser | None = None

    def make_reasoning_parser(self, name: str, tokenizer: Any) -> ReasoningParser:
        """The reasoning parser `name` over the model's tokenizer (`tag_reasoning_parser`).

        Raises:
            EngineConfigError: The engine has no parser of that name, or it cannot read this model's output.
        """
        return tag_reasoning_parser(name, tokenizer)

    def _start_reasoning(self, tokenizer: Any, *, on_error: Callable[[], None]) -> None:
        """Make the parser, if the engine has one, calling `on_error` (the model's release) before its error."""
        self._reasoning = None
        if self.reasoning_parser is None:
            return
        try:
            self._reasoning = self.make_reasoning_parser(self.reasoning_parser, tokenizer)
        except EngineConfigError:
            on_error()
            raise

    def _split_reasoning(self, outcome: Completion | Exception) -> Completion | Exception:
        """A completion with each sample's reasoning taken out of its text (as it is, without a parser)."""
        if self._reasoning is None or not isinstance(outcome, Completion):
            return outcome
        samples = [self._reasoning.split(sample) for sample in outcome.samples]
        return Completion.from_samples(outcome.prompt_tokens, samples, cached_tokens=outcome.cached_tokens)


@dataclass(frozen=True)
class TagReasoningParser:
    """The reasoning between a start and an end tag, as vLLM's `<think>` parsers read it (see the module notes).

    Attributes:
        start: The tag that opens the reasoning (`<think>`).
        end: The tag that closes it (`</think>`).
        decode: The tokenizer's decoding of generated token ids (`decode(ids)`), to place the tags among the
            tokens; `None`: count the tokens with `encode` instead.
        encode: Token ids of a text, where there are no token ids to count (an engine that gives none).

    Example:
        ```python
        parser = TagReasoningParser("<think>", "</think>", encode=lambda text: text.split())
        sample = parser.split(Sample("<think>two plus two</think>4", 9, "stop"))
        assert (sample.reasoning, sample.text, sample.reasoning_tokens) == ("two plus two", "4", 3)
        ```
    """

    start: str
    end: str
    decode: Callable[[Sequence[int]], str] | None = None
    encode: Callable[[str], Sequence[int]] | None = None

    def split(self, sample: Sample) -> Sample:
        text = sample.text
        opened = text.find(self.start)
        begin = opened + len(self.start) if opened >= 0 else 0
        closed = text.find(self.end, begin)
        finish = closed if closed >= 0 else len(text)
        reasoning = text[begin:finish]
        content = text[finish + len(self.end) :] if closed >= 0 else ""
        tokens = self._count(sample.token_ids, reasoning, begin, finish)
        return replace(sample, text=content, reasoning=reasoning, reasoning_tokens=tokens)

    def _count(self, token_ids: Sequence[int], reasoning: str, begin: int, finish: int) -> int:
        """The generated tokens that lie between the tags (its text's, retokenized, without token ids)."""
        if not token_ids or self.decode is None:
            return len(self.encode(reasoning)) if self.encode is not None and reasoning else 0
        return max(_tokens_within(token_ids, finish, self.decode) - _tokens_within(token_ids, begin, self.decode), 0)


def _tokens_within(token_ids: Sequence[int], characters: int, decode: Callable[[Sequence[int]], str]) -> int:
    """How many of the leading tokens decode to at most `characters` characters (a binary search of prefixes)."""
    low, high = 0, len(token_ids)
    while low < high:
        middle = (low + high + 1) // 2
        if len(decode(token_ids[:middle])) <= characters:
            low = middle
        else:
            high = middle - 1
    return low


def tag_reasoning_parser(name: str, tokenizer: Any) -> TagReasoningParser:
    """The tag parser `name` (one of `TAG_PARSERS`) over a Hugging Face tokenizer.

    Raises:
        EngineConfigError: `name` is none of them.
    """
    tags = TAG_PARSERS.get(name)
    if tags is None:
        known = ", ".join(TAG_PARSERS)
        raise EngineConfigError(f"unknown reasoning parser {name!r}: this engine has {known} (the vllm engine, vLLM's)")
    return TagReasoningParser(*tags, decode=_decoder(tokenizer), encode=_encoder(tokenizer))


def _decoder(tokenizer: Any) -> Callable[[Sequence[int]], str] | None:
    decode = getattr(tokenizer, "decode", None)
    return (lambda ids: decode(list(ids), skip_special_tokens=True)) if decode is not None else None


def _encoder(tokenizer: Any) -> Callable[[str], Sequence[int]] | None:
    encode = getattr(tokenizer, "encode", None)
    return (lambda text: encode(text, add_special_tokens=False)) if encode is not None else None


@dataclass(frozen=True)
class VLLMReasoningParser:
    """One of vLLM's reasoning parsers (`ReasoningParserManager`), over the engine's tokenizer.

    Attributes:
        parser: The vLLM parser.
        request: The chat request its `extract_reasoning` reads (some parsers read its template keywords).

    Example:
        ```python
        parser = vllm_reasoning_parser("qwen3", llm.get_tokenizer())
        ```
    """

    parser: Any
    request: Any

    def split(self, sample: Sample) -> Sample:
        reasoning, content = self.parser.extract_reasoning(sample.text, self.request)
        tokens = self.parser.count_reasoning_tokens(list(sample.token_ids)) if sample.token_ids else 0
        return replace(sample, text=content or "", reasoning=reasoning, reasoning_tokens=int(tokens))


def vllm_reasoning_parser(name: str, tokenizer: Any) -> VLLMReasoningParser:
    """vLLM's reasoning parser `name` over `tokenizer` (vLLM must be installed).

    Raises:
        EngineConfigError: vLLM has no parser of that name, or it cannot read this model's output (a parser
            that needs its tags to be tokens of the vocabulary, say).
    """
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    known = ReasoningParserManager.list_registered()
    if name not in known:
        raise EngineConfigError(f"unknown reasoning parser {name!r}: vLLM has {', '.join(sorted(known))}")
    try:
        parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    except Exception as error:  # vLLM's parsers raise RuntimeError or ValueError for a tokenizer they cannot read
        raise EngineConfigError(f"vLLM's reasoning parser {name!r} cannot read this model's output: {error}") from error
    request = ChatCompletionRequest(model="", messages=[{"role": "user", "content": ""}])
    return VLLMReasoningParser(parser, request)
