"""The fake model: a character-level tokenizer and a deterministic "reverse the prompt" decoder."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.exceptions import VLLMValidationError
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams

BOS_ID = 1
EOS_ID = 2
_CHAR_OFFSET = 3
_SPECIAL_IDS = {"<s>": BOS_ID, "</s>": EOS_ID}
_SPECIAL_TEXT = {v: k for k, v in _SPECIAL_IDS.items()}
_SPECIAL_RE = re.compile("(<s>|</s>)")

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
FAKE_GPU_BLOCKS = 64
"""KV-cache blocks the fake engine core "finds" after profiling memory."""


class FakeTokenizer:
    """One token per character, `<s>`/`</s>` as BOS/EOS; models named `*instruct*` have a chat template."""

    bos_token = "<s>"
    eos_token = "</s>"
    bos_token_id = BOS_ID
    eos_token_id = EOS_ID

    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template

    def encode(
        self,
        text: str,
        truncation: bool | None = None,
        max_length: int | None = None,
        add_special_tokens: bool = True,
    ) -> list[int]:
        ids = [BOS_ID] if add_special_tokens else []
        for piece in _SPECIAL_RE.split(text):
            if piece in _SPECIAL_IDS:
                ids.append(_SPECIAL_IDS[piece])
            else:
                ids.extend(ord(char) + _CHAR_OFFSET for char in piece)
        return ids[:max_length] if truncation and max_length is not None else ids

    def decode(self, ids: Sequence[int] | int, skip_special_tokens: bool = False) -> str:
        ids = [ids] if isinstance(ids, int) else ids
        return "".join(
            ("" if skip_special_tokens else _SPECIAL_TEXT[i]) if i in _SPECIAL_TEXT else chr(i - _CHAR_OFFSET)
            for i in ids
        )

    def apply_chat_template(
        self,
        messages: list[Mapping[str, str]],
        tools: list[dict[str, Any]] | None = None,
        *,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        if self.chat_template is None:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")
        text = self.bos_token + "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "<|assistant|>"
        return self.encode(text, add_special_tokens=False) if tokenize else text


def start_engine(engine_args: Any) -> tuple[VllmConfig, FakeTokenizer]:
    """What the real engine core does at start-up, reduced to the config values it fills in."""
    config = engine_args.create_engine_config()
    config.cache_config.num_gpu_blocks = FAKE_GPU_BLOCKS
    tokenizer = FakeTokenizer(CHAT_TEMPLATE if "instruct" in engine_args.model.lower() else None)
    return config, tokenizer


def parse_prompt(prompt: Any, tokenizer: FakeTokenizer) -> tuple[str | None, list[int]]:
    """A `PromptType` (text, `TextPrompt` or `TokensPrompt`) as (prompt text, token ids)."""
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
        return prompt.get("prompt"), list(prompt["prompt_token_ids"])
    if isinstance(prompt, Mapping) and "prompt" in prompt:
        return prompt["prompt"], tokenizer.encode(prompt["prompt"])
    raise TypeError(f"unsupported prompt: {prompt!r}")


def validate_prompt(prompt_token_ids: list[int], max_model_len: int) -> None:
    """vLLM's decoder-prompt length check."""
    if not prompt_token_ids:
        raise VLLMValidationError("The decoder prompt cannot be empty")
    if len(prompt_token_ids) >= max_model_len:
        raise VLLMValidationError(
            f"The decoder prompt (length {len(prompt_token_ids)}) plus the number of requested output tokens "
            f"(at least 1) is longer than the maximum model length of {max_model_len}."
        )


@dataclass
class Step:
    """The completion after one decode step."""

    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: str | None


def decode_steps(
    prompt_token_ids: list[int], params: SamplingParams, tokenizer: FakeTokenizer, max_model_len: int
) -> Iterator[Step]:
    """Generate the reversed prompt text token by token, then EOS; stop strings and limits end it early."""
    content = tokenizer.decode(prompt_token_ids, skip_special_tokens=True)
    planned = [*tokenizer.encode(content[::-1], add_special_tokens=False), EOS_ID]
    limit = params.max_tokens if params.max_tokens is not None else max_model_len - len(prompt_token_ids)
    generated: list[int] = []
    for token in planned:
        generated.append(token)
        text = tokenizer.decode(generated, skip_special_tokens=params.skip_special_tokens)
        finish, stop_reason = ("stop", None) if token == EOS_ID else (None, None)
        for stop in params.stop or ():
            at = text.find(stop)
            if finish is None and at >= 0:
                text = text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
                finish, stop_reason = "stop", stop
        if finish is None and (len(generated) >= limit or len(prompt_token_ids) + len(generated) >= max_model_len):
            finish = "length"
        yield Step(list(generated), text, finish, stop_reason)
        if finish is not None:
            return


def request_output(request_id: str, prompt: str | None, prompt_token_ids: list[int], step: Step) -> RequestOutput:
    completion = CompletionOutput(
        index=0,
        text=step.text,
        token_ids=step.token_ids,
        cumulative_logprob=None,
        logprobs=None,
        finish_reason=step.finish_reason,
        stop_reason=step.stop_reason,
    )
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=prompt_token_ids,
        prompt_logprobs=None,
        outputs=[completion],
        finished=step.finish_reason is not None,
    )
