"""A chat request's conversation, as OpenAI's API takes it, and its chat template keywords (`chat_template_kwargs`).

Messages keep what a chat template reads: `role` and text `content` (text content parts joined),
an assistant's `tool_calls` (OpenAI's shape; `content` may then be null), a tool message's
`tool_call_id`, and a `name`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyteplugins_batcher.batch_api._fields import FieldChecks

MESSAGE_ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool", "function")
"""The roles a chat message may have, as OpenAI's API takes them."""

RESERVED_TEMPLATE_KEYWORDS = ("tokenize", "conversation", "messages", "tools", "chat_template", "return_dict")
"""Keywords the chat template call sets itself: `chat_template_kwargs` may not set them."""


def chat_messages(data: Mapping[str, Any], checks: FieldChecks) -> list[dict[str, Any]]:
    """The request's `messages`, each reduced to what a chat template reads.

    Raises:
        RequestLineError: `invalid_body`, naming the message and what is wrong with it.
    """
    where = f"{checks.prefix}messages"
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise checks.fail("invalid_body", f"{where} must be a non-empty list of chat messages")
    return [_message(message, f"{where}[{index}]", checks) for index, message in enumerate(messages)]


def _message(message: Any, where: str, checks: FieldChecks) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise checks.fail("invalid_body", f"{where}: each message needs a 'role' and 'content'")
    role = message["role"]
    if role not in MESSAGE_ROLES:
        raise checks.fail("invalid_body", f"{where}.role must be one of {', '.join(MESSAGE_ROLES)}; got {role!r}")
    calls = message.get("tool_calls") if role == "assistant" else None
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts: text parts only
        texts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
        if len(texts) != len(content) or not all(isinstance(text, str) for text in texts):
            raise checks.fail("invalid_body", f"{where}: only text content parts are supported")
        content = "".join(texts)
    if content is None and calls:
        content = ""  # an assistant turn that only called tools; templates read its calls
    if not isinstance(content, str):
        raise checks.fail("invalid_body", f"{where}: message content must be text")
    shaped: dict[str, Any] = {"role": role, "content": content}
    if calls:
        shaped["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls", checks)
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            shaped[key] = message[key]
    return shaped


def _tool_calls(calls: Any, where: str, checks: FieldChecks) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise checks.fail("invalid_body", f"{where} must be a list of tool calls")
    shaped = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise checks.fail(
                "invalid_body", f'{where}[{index}] must be {{"type": "function", "function": {{"name", "arguments"}}}}'
            )
        arguments = function.get("arguments", "")
        if not isinstance(arguments, (str, dict)):
            raise checks.fail("invalid_body", f"{where}[{index}].function.arguments must be JSON text")
        shaped.append(
            {
                "id": str(call.get("id") or f"call_{index}"),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return shaped


def template_kwargs(value: Any, checks: FieldChecks) -> dict[str, Any] | None:
    """`chat_template_kwargs`: more keywords for the chat template (`{"enable_thinking": false}`), or None.

    Raises:
        RequestLineError: `invalid_request`: not an object, or setting a keyword the call sets itself.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise checks.invalid("chat_template_kwargs", f"must be an object, got {value!r}")
    reserved = sorted(set(value) & set(RESERVED_TEMPLATE_KEYWORDS))
    if reserved:
        raise checks.invalid(f"chat_template_kwargs.{reserved[0]}", "is set by the server itself; leave it out")
    return dict(value) or None
