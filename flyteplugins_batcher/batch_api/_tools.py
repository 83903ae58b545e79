"""Tools in a chat request: reading `tools` and `tool_choice`, constraining the output to a call, finding calls.

As vLLM does it: a named `tool_choice` constrains the output to that function's `parameters`
schema (the text is the call's arguments), and `"required"` to a JSON array of
`{"name", "parameters"}` objects, one of the tools each, so the arguments always follow the tools'
schemas. `"auto"` lets the model answer in text or call tools in its own format, which a tool
parser reads (vLLM's `--tool-call-parser`): `hermes` (`<tool_call>{"name", "arguments"}</tool_call>`,
as Qwen and Hermes models write them) or `llama3_json` (`{"name", "parameters"}` objects). Without
a parser, `"auto"` (the default once tools are given) fails its line, saying so. `"none"` answers
in text. The tools always reach the chat template, which shows them to the model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flyteplugins_batcher.batch_api._fields import FieldChecks
from flyteplugins_batcher.engines import ResponseFormat

TOOL_PARSERS = ("hermes", "llama3_json")
"""The tool parsers `tool_choice: "auto"` can use, by vLLM's `--tool-call-parser` names."""

ToolChoice = Literal["none", "auto", "required", "named"]

_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolUse:
    """One chat request's tools, and how it lets the model use them.

    Attributes:
        tools: The tool definitions as the request gave them (`{"type": "function", "function": {...}}`).
        choice: `"none"`, `"auto"`, `"required"`, or `"named"` (`function` then names the tool).
        function: The function a named choice calls.
        parser: The tool parser `"auto"` reads calls with (one of `TOOL_PARSERS`).
        parallel: Whether a required choice may make several calls (`parallel_tool_calls`).

    Example:
        ```python
        weather = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
        use = ToolUse((weather,), "named", function="weather")
        assert use.output_format() == ResponseFormat.json_schema({"type": "object"})
        ```
    """

    tools: tuple[Mapping[str, Any], ...]
    choice: ToolChoice
    function: str | None = None
    parser: str = ""
    parallel: bool = True

    @property
    def calls_expected(self) -> bool:
        """Whether the answer is read for tool calls (every choice but `"none"`)."""
        return self.choice != "none"

    def parameters(self, name: str) -> dict[str, Any]:
        """A tool's `parameters` schema (an empty object's when it has none)."""
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return dict(tool["function"].get("parameters") or _EMPTY_PARAMETERS)
        raise KeyError(name)

    def output_format(self) -> ResponseFormat | None:
        """What the output is constrained to: a named tool's parameters, or an array of calls for `"required"`."""
        if self.choice == "named":
            return ResponseFormat.json_schema(self.parameters(str(self.function)), name=self.function)
        if self.choice == "required":
            return ResponseFormat.json_schema(self._calls_schema(), name="tool_calls")
        return None

    def _calls_schema(self) -> dict[str, Any]:
        """vLLM's schema for required calls: an array of `{"name", "parameters"}` objects, `$defs` lifted."""
        variants, definitions = [], {}
        for tool in self.tools:
            name = tool["function"]["name"]
            parameters = copy.deepcopy(self.parameters(name))
            definitions.update(parameters.pop("$defs", None) or {})
            variants.append(
                {
                    "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
                    "required": ["name", "parameters"],
                }
            )
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
        if not self.parallel:
            schema["maxItems"] = 1
        if definitions:
            schema["$defs"] = definitions
        return schema

    def read(self, text: str, call_ids: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The answer's content and tool calls (OpenAI's `tool_calls` shape); no calls when the text holds none.

        Args:
            text: The generated text.
            call_ids: Seeds the calls' ids (the response's id and the choice's index), so that an
                answer read twice has the same ids.
        """
        found: list[tuple[str, Any]] | None = None
        content: str | None = text
        if self.choice == "named":  # the text is the arguments, passed on as the model wrote them (as vLLM does)
            found = [(str(self.function), text.strip())] if isinstance(_json(text), dict) else None
            content = None if found else text
        elif self.choice == "required":  # an array cut by max_tokens gives the calls it completed
            found = _named_objects(_json(text), "parameters") or _named_objects(completed_items(text), "parameters")
            content = None if found else text
        elif self.choice == "auto":
            content, found = parse_tool_calls(self.parser, text)
        calls = [_call(name, arguments, f"{call_ids}-{index}") for index, (name, arguments) in enumerate(found or [])]
        return content, calls


def parse_tool_calls(parser: str, text: str) -> tuple[str | None, list[tuple[str, Any]] | None]:
    """The content and `(name, arguments)` calls a tool parser reads in text (no calls: the text is the content)."""
    if parser == "hermes":
        if "<tool_call>" not in text:
            return text, None
        calls = [_json(match.strip()) for match in _HERMES_CALL.findall(text)]
        found = _named_objects(calls, "arguments")
        before = text[: text.index("<tool_call>")].strip()
        return (before or None, found) if found else (text, None)
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, None
    found = _named_objects([_json(part) for part in body.split(";")], "parameters", "arguments")
    return (None, found) if found else (text, None)


def tool_use(data: Mapping[str, Any], checks: FieldChecks, parser: str) -> ToolUse | None:
    """A chat request's `tools` and `tool_choice` (`"auto"` when tools are given without one), or None.

    Raises:
        RequestLineError: `invalid_request`, naming the field: tools of the wrong shape, a choice of
            a tool not given, or `"auto"` with no tool parser.
    """
    tools, choice = data.get("tools"), data.get("tool_choice")
    if tools is None or tools == []:  # clients send an empty list for "no tools", as vLLM takes it
        if choice not in (None, "none"):
            raise checks.invalid("tool_choice", f"is {choice!r}, but the request gives no tools")
        return None
    checked = _tools(tools, checks)
    names = [tool["function"]["name"] for tool in checked]
    parallel = data.get("parallel_tool_calls")
    use = _choice(choice if choice is not None else "auto", names, checks)
    if use[0] == "auto" and parser and parser not in TOOL_PARSERS:
        known = ", ".join(TOOL_PARSERS)
        raise checks.invalid(
            "tool_choice", f'is "auto", but the tool parser {parser!r} is not one this server has ({known})'
        )
    if use[0] == "auto" and not parser:
        raise checks.invalid(
            "tool_choice",
            'is "auto" (the default once tools are given), which needs a tool parser to find calls in the text: '
            "run with --tool-call-parser (as vLLM's; one of " + ", ".join(TOOL_PARSERS) + '), or ask for "required", '
            'a named function or "none"',
        )
    return ToolUse(tuple(checked), use[0], use[1], parser, parallel is not False)


def _tools(value: Any, checks: FieldChecks) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise checks.invalid("tools", f"must be a non-empty list of tools, got {value!r}")
    for index, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise checks.invalid(f"tools[{index}]", 'must be {"type": "function", "function": {"name": ...}}')
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise checks.invalid(f"tools[{index}].function.name", f"must be a non-empty string, got {function!r}")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise checks.invalid(
                f"tools[{index}].function.parameters", f"must be a JSON schema object, got {parameters!r}"
            )
    return value


def _choice(value: Any, names: Sequence[str], checks: FieldChecks) -> tuple[ToolChoice, str | None]:
    if value in ("none", "auto", "required"):
        return value, None
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise checks.invalid(
            "tool_choice",
            f'must be "none", "auto", "required" or {{"type": "function", "function": {{"name": ...}}}}, got {value!r}',
        )
    if name not in names:
        raise checks.invalid(
            "tool_choice.function.name", f"is {name!r}, which is not one of the tools ({', '.join(names)})"
        )
    return "named", name


def completed_items(text: str) -> list[Any]:
    """The items a JSON array completed before it was cut off (`[{...}, {...}, {"na` gives the first two).

    Example:
        ```python
        assert completed_items('[{"name": "a"}, {"name": "b"}, {"na') == [{"name": "a"}, {"name": "b"}]
        ```
    """
    decoder = json.JSONDecoder()
    items: list[Any] = []
    position = _skip_space(text, 0)
    if not text.startswith("[", position):
        return items
    position += 1
    while True:
        try:
            item, position = decoder.raw_decode(text, _skip_space(text, position))
        except ValueError:
            return items
        items.append(item)
        position = _skip_space(text, position)
        if not text.startswith(",", position):
            return items
        position += 1


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _named_objects(value: Any, *argument_keys: str) -> list[tuple[str, Any]] | None:
    """`(name, arguments)` of each `{"name", <argument key>}` object in a list, or None when any is not one."""
    items = value if isinstance(value, list) else None
    if not items:
        return None
    found = []
    for item in items:
        key = next((key for key in argument_keys if isinstance(item, dict) and key in item), None)
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or key is None:
            return None
        found.append((item["name"], item[key]))
    return found


def _call(name: str, arguments: Any, seed: str) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    digest = hashlib.sha256(seed.encode()).hexdigest()[:24]
    return {"id": f"call_{digest}", "type": "function", "function": {"name": name, "arguments": text}}
