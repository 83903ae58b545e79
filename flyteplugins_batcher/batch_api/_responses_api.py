"""OpenAI's Responses API (`/v1/responses`) read as a chat request: the same messages, settings and tools.

A Responses body becomes the chat body it means, then runs the chat pipeline unchanged (the same
`BatchRequest`, engine `Request` and engine), so that a Responses request and a chat request with
the same content get the same answer. What it takes, named as the Responses API names it in errors:

- `input`: a string (one user message), or items: messages (`{"role", "content"}`, with or
  without `"type": "message"`; roles `user`, `system`, `developer`, `assistant`; content a string
  or `input_text`/`output_text` parts), `function_call` items (an assistant's earlier call) and
  `function_call_output` items (its result). `reasoning` items an earlier answer carried are
  dropped (the model's own notes; templates do not read them). Any other item or part type (images,
  files, hosted tools' calls, `item_reference`) fails the request, naming it.
- `instructions`: a system message before the input.
- `max_output_tokens`, `temperature`, `top_p`, `parallel_tool_calls`, `metadata` (echoed back).
- `text.format`: `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "name",
  "schema", "strict"}` (structured output, always enforced); a schema that is not one fails naming
  `text.format.schema`.
- `tools`: function tools (`{"type": "function", "name", "description", "parameters", "strict"}`), and
  `tool_choice` (`"none"`, `"auto"` with a tool parser, `"required"`, `{"type": "function", "name"}`),
  as a chat request's.
- `store`: responses are not stored, whatever it says: the answer says `"store": false`, and what
  needs a stored response (`previous_response_id`, `conversation`, `background`) is refused, as are
  reusable `prompt`s, `truncation: "auto"`, `max_tool_calls` and `top_logprobs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyteplugins_batcher.batch_api._fields import INT64, FieldChecks

RESPONSES_ENDPOINT = "/v1/responses"

INPUT_ROLES = ("user", "system", "developer", "assistant")
"""The roles of a Responses input message."""

_TEXT_PARTS = ("input_text", "output_text", "text")
"""Content parts that hold text (`text`: as chat content parts are written)."""

_REFUSED = {
    "previous_response_id": "needs a stored response, and responses are not stored here: send the earlier items "
    "in input instead",
    "conversation": "needs stored conversations, which this server does not keep: send the items in input instead",
    "background": "is not supported: a response is answered while the request waits (or streamed)",
    "prompt": "(a stored prompt template) is not supported: send the instructions and input themselves",
    "max_tool_calls": "is not supported: the tools' calls are not run here, only returned",
    "top_logprobs": "is not supported on /v1/responses (use /v1/chat/completions for logprobs)",
}
"""Fields that would ask for what this server does not do, refused by name (null, false and 0 are their defaults)."""

_ECHOED = ("instructions", "max_output_tokens", "temperature", "top_p", "metadata", "parallel_tool_calls")


def chat_body(body: Mapping[str, Any], checks: FieldChecks) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat body a Responses body means, and what the answer repeats of the request (`Response`'s fields).

    Raises:
        RequestLineError: `invalid_body` for input it cannot read (naming the item and its type),
            `invalid_request` for a setting it refuses or that is out of range (named as written).
    """
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, False, 0):
            raise checks.invalid(key, why)
    if body.get("truncation") not in (None, "disabled"):
        raise checks.invalid("truncation", f"must be 'disabled' (input is never cut), got {body['truncation']!r}")
    checks.boolean(body, "store")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise checks.invalid("instructions", f"must be a string, got {instructions!r}")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + input_messages(
        body.get("input"), checks
    )
    chat: dict[str, Any] = {"messages": messages, **_settings(body, checks)}
    tools = function_tools(body.get("tools"), checks)
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"], [tool["function"]["name"] for tool in tools], checks)
    echo = {key: body.get(key) for key in _ECHOED}
    echo |= {"tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto"}
    echo["text"] = {"format": dict((body.get("text") or {}).get("format") or {"type": "text"})}
    return chat, echo


def _settings(body: Mapping[str, Any], checks: FieldChecks) -> dict[str, Any]:
    """`max_output_tokens` (checked here, to be named so), the sampling settings and `text.format`, as chat's."""
    settings: dict[str, Any] = {key: body.get(key) for key in ("temperature", "top_p", "parallel_tool_calls", "stream")}
    limit = checks.integer(body, "max_output_tokens", 1, INT64 - 1)
    if limit is not None:
        if checks.context_length and limit >= checks.context_length:
            message = (
                f"{checks.prefix}max_output_tokens is {limit}, but the model's context holds "
                f"{checks.context_length} tokens, the input included"
            )
            raise checks.fail("context_length_exceeded", message)
        settings["max_completion_tokens"] = limit
    response_format = text_format(body.get("text"), checks)
    if response_format is not None:
        settings["response_format"] = response_format
    return {key: value for key, value in settings.items() if value is not None}


def input_messages(value: Any, checks: FieldChecks) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; items become messages in order.

    Consecutive `function_call` items (and an assistant message just before them) make one assistant
    turn with several tool calls, as a chat conversation writes parallel calls.
    """
    where = f"{checks.prefix}input"
    if isinstance(value, str):
        if not value.strip():
            raise checks.fail("invalid_body", f"{where} is empty: there is nothing to answer")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise checks.fail("invalid_body", f"{where} must be a string or a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        message = _item(item, f"{where}[{index}]", checks)
        if message is None:
            continue
        previous = messages[-1] if messages else None
        if "tool_calls" in message and previous is not None and previous["role"] == "assistant":
            previous.setdefault("tool_calls", []).extend(message["tool_calls"])
            continue
        messages.append(message)
    if not messages:
        raise checks.fail("invalid_body", f"{where} holds no message to answer")
    return messages


def _item(item: Any, where: str, checks: FieldChecks) -> dict[str, Any] | None:
    """One input item as a chat message (None: an item the conversation does not show the model)."""
    if not isinstance(item, Mapping):
        raise checks.fail("invalid_body", f"{where} must be an input item (an object), got {item!r}")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in INPUT_ROLES:
            raise checks.fail("invalid_body", f"{where}.role must be one of {', '.join(INPUT_ROLES)}; got {role!r}")
        return {"role": role, "content": _content(item.get("content"), f"{where}.content", checks)}
    if kind == "function_call":
        call_id, name, arguments = (item.get(key) for key in ("call_id", "name", "arguments"))
        if not all(isinstance(part, str) for part in (call_id, name, arguments)):
            raise checks.fail("invalid_body", f"{where}: a function_call item needs call_id, name and arguments text")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise checks.fail("invalid_body", f"{where}.call_id must be the id of the call it answers")
        return {
            "role": "tool",
            "tool_call_id": call_id,
            "content": _content(item.get("output"), f"{where}.output", checks),
        }
    if kind == "reasoning":
        return None
    supported = "message, function_call, function_call_output (and reasoning, which is dropped)"
    raise checks.fail("invalid_body", f"{where}.type {kind!r} is not supported here; input items may be {supported}")


def _content(value: Any, where: str, checks: FieldChecks) -> str:
    """A message's text: a string, or its text parts joined (any other part fails, naming its type)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise checks.fail("invalid_body", f"{where} must be a string or a list of content parts")
    texts = []
    for index, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise checks.fail(
                "invalid_body",
                f"{where}[{index}].type {kind!r} is not supported here; content parts may be input_text or output_text",
            )
        texts.append(part["text"])
    return "".join(texts)


def text_format(value: Any, checks: FieldChecks) -> dict[str, Any] | None:
    """`text.format` as a chat `response_format` (None for plain text), its schema checked where it can be.

    A schema is checked against JSON Schema's meta-schema when `jsonschema` is installed, so that
    a schema that is not one fails here naming `text.format.schema`; the engine's grammar compiler
    checks the rest (what it cannot enforce) before the request runs.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise checks.invalid("text", f'must be an object such as {{"format": {{"type": "text"}}}}, got {value!r}')
    form = value.get("format")
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise checks.invalid("text.format.type", f"must be one of text, json_object, json_schema, got {kind!r}")
    name, schema, strict = form.get("name"), form.get("schema"), form.get("strict")
    if not isinstance(schema, Mapping):
        raise checks.invalid("text.format.schema", f"must be a JSON schema object, got {schema!r}")
    if strict is not None and not isinstance(strict, bool):
        raise checks.invalid("text.format.strict", f"must be true or false, got {strict!r}")
    problem = schema_problem(schema)
    if problem is not None:
        raise checks.invalid("text.format.schema", f"is not a valid JSON schema: {problem}")
    return {"type": "json_schema", "json_schema": {"name": name or "response", "schema": schema, "strict": strict}}


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """What makes `schema` no JSON schema (by the meta-schema), or None (also when `jsonschema` is not installed)."""
    try:
        import jsonschema
    except ImportError:  # the engine's grammar compiler still checks it before it runs
        return None
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        path = "".join(f"[{part!r}]" for part in error.path)
        return f"{error.message}{f' at {path}' if path else ''}"
    return None


def function_tools(value: Any, checks: FieldChecks) -> list[dict[str, Any]]:
    """Responses function tools (`{"type": "function", "name", "parameters", ...}`) as chat tools."""
    if value is None or value == []:
        return []
    if not isinstance(value, list):
        raise checks.invalid("tools", f"must be a list of tools, got {value!r}")
    tools = []
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise checks.invalid(f"tools[{index}].type", f"is {kind!r}; only function tools are supported here")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise checks.invalid(f"tools[{index}].name", f"must be a non-empty string, got {tool.get('name')!r}")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], Mapping):
            raise checks.invalid(
                f"tools[{index}].parameters", f"must be a JSON schema object, got {tool['parameters']!r}"
            )
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any, names: list[str], checks: FieldChecks) -> Any:
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function" and isinstance(value.get("name"), str):
        if names and value["name"] not in names:
            raise checks.invalid(
                "tool_choice.name", f"is {value['name']!r}, which is not one of the tools ({', '.join(names)})"
            )
        return {"type": "function", "function": {"name": value["name"]}}
    raise checks.invalid(
        "tool_choice", f'must be "none", "auto", "required" or {{"type": "function", "name": ...}}, got {value!r}'
    )
