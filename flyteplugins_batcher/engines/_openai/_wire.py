"""A record as an OpenAI request body, and an OpenAI answer as a `Completion` (or the error that fails its record).

Chat messages and plain text go to `/v1/chat/completions` (text as one user message, the system prompt first); a
`Request` with `chat_template=False` goes to `/v1/completions` as written. Settings map to OpenAI's fields, with
vLLM's `structured_outputs` for a regex, a choice or a grammar (an endpoint that is not vLLM refuses them, and the
record fails with its words). An answer that is not an OpenAI response is an error of its own, never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flyteplugins_batcher import BatcherError
from flyteplugins_batcher.engines._completion import Completion, FinishReason, Sample, TokenLogprob
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._prompts import Request, normalize_record


class GarbledAnswerError(BatcherError, ValueError):
    """The endpoint answered with something that is not an OpenAI response (not JSON, no choices, ...)."""


@dataclass(frozen=True)
class WireRequest:
    """One record's HTTP call: its path below the base URL, its JSON body, and the tokens it may use (for limits)."""

    path: str
    body: dict[str, Any]
    estimated_tokens: int


def wire_request(record: object, generation: GenerationConfig, model: str, system_prompt: str | None) -> WireRequest:
    """The call that answers `record` with `generation`, from the model `model` (or the record's adapter).

    Raises:
        InvalidPromptError: The record is not a prompt (`normalize_record`).
    """
    content = normalize_record(record)
    request = record if isinstance(record, Request) else None
    body: dict[str, Any] = {"model": request.adapter if request and request.adapter else model}
    body.update(generation_fields(generation))
    as_written = request is not None and request.chat_template is False and isinstance(content, str)
    if as_written:
        body["prompt"] = content
        path = "/completions"
    else:
        messages = [{"role": "user", "content": content}] if isinstance(content, str) else [dict(m) for m in content]
        if system_prompt and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": system_prompt})
        body["messages"] = messages
        if request is not None and request.tools:
            body["tools"] = [dict(tool) for tool in request.tools]
        if request is not None and request.template_kwargs:
            body["chat_template_kwargs"] = dict(request.template_kwargs)
        path = "/chat/completions"
    text = json.dumps(body.get("messages") or body.get("prompt"), ensure_ascii=False)
    return WireRequest(path, body, len(text) // 4 + 1 + generation.generated_tokens)


def generation_fields(generation: GenerationConfig) -> dict[str, Any]:
    """OpenAI's fields for the settings (those at their defaults left out, as a client would)."""
    fields: dict[str, Any] = {"max_tokens": generation.max_new_tokens, "temperature": generation.temperature}
    defaults = GenerationConfig()
    for name in ("top_p", "seed", "n", "presence_penalty", "frequency_penalty"):
        if getattr(generation, name) != getattr(defaults, name):
            fields[name] = getattr(generation, name)
    if generation.stop:
        fields["stop"] = list(generation.stop)
    if generation.logit_bias:
        fields["logit_bias"] = {str(token): bias for token, bias in generation.logit_bias}
    if generation.logprobs is not None:
        fields["logprobs"] = True
        fields["top_logprobs"] = generation.logprobs
    constraint = generation.response_format
    if constraint is not None:
        if constraint.kind == "json_object":
            fields["response_format"] = {"type": "json_object"}
        elif constraint.kind == "json_schema":
            schema = {"name": constraint.name or "schema", "schema": json.loads(constraint.schema or "{}")}
            fields["response_format"] = {"type": "json_schema", "json_schema": schema}
        else:
            value = {"regex": constraint.pattern, "choice": list(constraint.options), "grammar": constraint.rules}
            fields["structured_outputs"] = {constraint.kind: value[constraint.kind]}
    return fields


def completion_of(answer: object, *, chat: bool, logprobs: bool) -> Completion:
    """The `Completion` an OpenAI answer gives: its choices as samples, its `usage` as token counts.

    Raises:
        GarbledAnswerError: It is not an OpenAI response (no choices, no usage, wrong types).
    """
    if not isinstance(answer, Mapping) or not isinstance(answer.get("choices"), list) or not answer["choices"]:
        raise GarbledAnswerError(f"no choices in the answer: {_head(answer)}")
    usage = answer.get("usage")
    if not isinstance(usage, Mapping) or not isinstance(usage.get("completion_tokens"), int):
        raise GarbledAnswerError(f"no usage in the answer: {_head(answer)}")
    choices = sorted(answer["choices"], key=lambda choice: choice.get("index", 0) if isinstance(choice, Mapping) else 0)
    completion_tokens = usage["completion_tokens"]
    shares = _split(completion_tokens, len(choices))
    pairs = zip(choices, shares, strict=True)
    samples = [_sample(choice, share, chat=chat, logprobs=logprobs) for choice, share in pairs]
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    cached_tokens = min(int(cached or 0), prompt_tokens)
    return Completion.from_samples(prompt_tokens, samples, cached_tokens)


def _sample(choice: object, tokens: int, *, chat: bool, logprobs: bool) -> Sample:
    if not isinstance(choice, Mapping):
        raise GarbledAnswerError(f"a choice is not an object: {_head(choice)}")
    if chat:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, Mapping) else None
        text = text if isinstance(text, str) else ("" if isinstance(message, Mapping) else None)
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        raise GarbledAnswerError(f"a choice has no text: {_head(choice)}")
    reason: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
    found = _logprobs(choice.get("logprobs"), chat=chat) if logprobs else None
    return Sample(text, tokens, reason, found)


def _logprobs(value: object, *, chat: bool) -> tuple[TokenLogprob, ...] | None:
    """Chat's `logprobs.content` or completions' parallel lists, as `TokenLogprob`s (`None` when absent)."""
    if not isinstance(value, Mapping):
        return None
    if chat:
        content = value.get("content") or []
        return tuple(
            TokenLogprob(
                str(item.get("token", "")),
                float(item.get("logprob", 0.0)),
                tuple(
                    (str(top.get("token", "")), float(top.get("logprob", 0.0)))
                    for top in item.get("top_logprobs") or ()
                ),
            )
            for item in content
            if isinstance(item, Mapping)
        )
    tokens, values = value.get("tokens") or [], value.get("token_logprobs") or []
    tops: Sequence[Any] = value.get("top_logprobs") or [None] * len(tokens)
    return tuple(
        TokenLogprob(str(token), float(logprob or 0.0), tuple((str(k), float(v)) for k, v in (top or {}).items()))
        for token, logprob, top in zip(tokens, values, tops, strict=False)
    )


def _split(total: int, parts: int) -> list[int]:
    """`total` tokens shared among `parts` samples (OpenAI's usage counts them together), the first taking the rest."""
    share, rest = divmod(max(total, 0), parts)
    return [share + (rest if index == 0 else 0) for index in range(parts)]


def _head(value: object, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)[:limit]
    return text[:limit]
