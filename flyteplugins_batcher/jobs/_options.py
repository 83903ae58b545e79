"""Options declared once, as dataclasses, and spread into a Flyte task's inputs.

A workflow's `main` takes, beside its own inputs, whole option sets: parameters annotated with a
dataclass, whose default is an instance of it. `task_with_options` turns each field of each option
set into an input of its own (`--chunk_size`, `--engine`, `--model`, ...) with the field's default
and the help written in the dataclass's `Attributes:` section, and calls `main` with the option
sets rebuilt from those inputs. A field added to a dataclass thus becomes a documented input of
every task that takes it: in `flyte run ... main --help`, in the UI and in the deployed interface.

Example:
    ```python
    @dataclass(frozen=True)
    class Sampling:
        \"\"\"How to sample.

        Attributes:
            temperature: 0 for greedy decoding.
        \"\"\"

        temperature: float = 0.0

    @task_with_options(env)
    async def main(prompt: str, sampling: Sampling = Sampling()) -> str:
        ...  # `flyte run file.py main --prompt hi --temperature 0.7`
    ```
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import docstring_parser
import flyte

TaskFunction = Callable[..., Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class OptionSet:
    """One option-set parameter of a task function: its dataclass and the defaults the function gives it."""

    parameter: str
    cls: type
    defaults: Any

    @property
    def field_names(self) -> list[str]:
        return [field.name for field in dataclasses.fields(self.cls) if field.init]

    def build(self, inputs: dict[str, Any]) -> Any:
        """The option set from the task's inputs (taking its fields out of `inputs`); missing fields keep defaults."""
        given = {name: inputs.pop(name) for name in self.field_names if name in inputs}
        return dataclasses.replace(self.defaults, **given)


@dataclasses.dataclass(frozen=True)
class DeclaredOption:
    """An option as a dataclass's field or a function's input declares it: the one place options are read.

    The jobs spread option sets into task inputs documented by it, the command line makes a flag of
    each (`flyteplugins-batcher run-batch --chunk-size`), and the server reads its settings from the
    environment by it (`BATCH_SERVE_*`).

    Attributes:
        name: The field's or the input's name.
        kind: Its type, with `None` taken out of an optional one (`int | None`: `int`).
        optional: Whether `None` is one of its values.
        default: Its default (a field's `default_factory` called); `inspect.Parameter.empty` or
            `dataclasses.MISSING` where it has none.
        help: Its help, from the docstring: a dataclass's `Attributes:` section, a function's `Args:`.

    Example:
        ```python
        chunk_size = DeclaredOption.fields_of(RunOptions)[0]
        assert (chunk_size.name, chunk_size.kind, chunk_size.default) == ("chunk_size", int, 8)
        ```
    """

    name: str
    kind: Any
    optional: bool
    default: Any
    help: str

    @classmethod
    def fields_of(cls, options: type) -> list[DeclaredOption]:
        """Each field of the dataclass `options` that its `__init__` takes.

        Raises:
            TypeError: A field has no help in the docstring's `Attributes:` section.
        """
        hints, described = typing.get_type_hints(options), _documented(options, "attribute")
        fields = [item for item in dataclasses.fields(options) if item.init]
        missing = [item.name for item in fields if not described.get(item.name)]
        if missing:
            raise TypeError(f"{options.__name__}: document {', '.join(missing)} in its docstring's Attributes section")
        return [cls.of(item.name, hints[item.name], _field_default(item), described[item.name]) for item in fields]

    @classmethod
    def inputs_of(cls, func: Callable[..., Any]) -> list[DeclaredOption]:
        """Each input of `func` (a task function), its help from the `Args:` section (empty where it has none)."""
        hints, described = typing.get_type_hints(func), input_help(func)
        return [
            cls.of(parameter.name, hints[parameter.name], parameter.default, described.get(parameter.name, ""))
            for parameter in inspect.signature(func).parameters.values()
        ]

    @classmethod
    def of(cls, name: str, annotation: Any, default: Any, help_text: str) -> DeclaredOption:
        """The option named `name` of type `annotation` (an optional one unwrapped)."""
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        kinds = typing.get_args(annotation) if union else (annotation,)
        given = [kind for kind in kinds if kind is not type(None)]
        return cls(name, given[0], len(given) < len(kinds), default, help_text)


def task_with_options(env: flyte.TaskEnvironment, **task_options: Any) -> Callable[[TaskFunction], Any]:
    """`env.task(**task_options)`, with the function's option sets spread into flat, documented inputs.

    The task's `--help` lists every input with its help (flyte's CLI shows the task's description,
    not per-input help, so the list goes there).

    Raises:
        TypeError: An option set without a default instance, an undocumented field, or two inputs
            with one name.
    """

    def decorate(func: TaskFunction) -> Any:
        spread = spread_options(func)
        return env.task(docs=flyte.Documentation(description=cli_help(spread)), **task_options)(spread)

    return decorate


def spread_options(func: TaskFunction) -> TaskFunction:
    """A function taking every field of `func`'s option sets as an input of its own, calling `func` with the sets.

    Its signature, type annotations and docstring (`Args:` with each field's help) are what Flyte
    builds the task's interface from.
    """
    hints = typing.get_type_hints(func)
    signature = inspect.signature(func)
    own: list[inspect.Parameter] = []
    option_sets: list[OptionSet] = []
    for parameter in signature.parameters.values():
        annotation = hints.get(parameter.name, parameter.annotation)
        if not (isinstance(annotation, type) and dataclasses.is_dataclass(annotation)):
            own.append(parameter.replace(annotation=annotation))
        elif isinstance(parameter.default, annotation):
            option_sets.append(OptionSet(parameter.name, annotation, parameter.default))
        else:
            raise TypeError(f"{func.__name__}: option set {parameter.name!r} needs a default {annotation.__name__}()")
    spread = own + [field for option_set in option_sets for field in _field_parameters(option_set)]
    _check_unique(func, [parameter.name for parameter in spread])

    @functools.wraps(func)
    async def with_option_sets(**inputs: Any) -> Any:
        for option_set in option_sets:
            inputs[option_set.parameter] = option_set.build(inputs)
        return await func(**inputs)

    returns = hints.get("return", signature.return_annotation)
    with_option_sets.__signature__ = signature.replace(parameters=spread, return_annotation=returns)  # type: ignore[attr-defined]
    with_option_sets.__annotations__ = {parameter.name: parameter.annotation for parameter in spread} | {
        "return": returns
    }
    with_option_sets.__doc__ = _docstring(func, option_sets)
    return with_option_sets


def option_help(cls: type) -> dict[str, str]:
    """Each field's help, from the `Attributes:` section of the dataclass's docstring.

    Raises:
        TypeError: A field has no help.
    """
    return {option.name: option.help for option in DeclaredOption.fields_of(cls)}


def input_help(func: Callable[..., Any]) -> dict[str, str]:
    """Each input's help, from the `Args:` section of the function's docstring (as Flyte reads it)."""
    return _documented(func, "param")


def cli_help(func: Callable[..., Any]) -> str:
    """The task's help for `flyte run ... --help` (Markdown, as flyte's CLI renders it): its description and inputs."""
    parsed = docstring_parser.parse(func.__doc__ or "")
    described = input_help(func)
    lines = [f"- `--{name}`: {described.get(name, '')}" for name in inspect.signature(func).parameters]
    prose = [text for text in (parsed.short_description, parsed.long_description) if text]
    return "\n\n".join([*prose, "Inputs:", "\n".join(lines)])


def _field_parameters(option_set: OptionSet) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(option_set.cls)
    return [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=getattr(option_set.defaults, name),
            annotation=hints[name],
        )
        for name in option_set.field_names
    ]


def _check_unique(func: TaskFunction, names: list[str]) -> None:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise TypeError(f"{func.__name__}: inputs {', '.join(repeated)} come from more than one place")


def _docstring(func: TaskFunction, option_sets: list[OptionSet]) -> str:
    """`func`'s docstring with its option sets' entries in `Args:` replaced by one entry per field."""
    parsed = docstring_parser.parse(func.__doc__ or "")
    spread = {option_set.parameter for option_set in option_sets}
    entries = {name: text for name, text in input_help(func).items() if name not in spread}
    for option_set in option_sets:
        entries.update(option_help(option_set.cls))
    prose = [text for text in (parsed.short_description, parsed.long_description) if text]
    args = "\n".join(f"    {name}: {text}" for name, text in entries.items())
    return "\n\n".join([*prose, f"Args:\n{args}"])


def _documented(documented: Any, section: str) -> dict[str, str]:
    """The help of each input (`param`: a function's `Args:`) or field (`attribute`: a dataclass's `Attributes:`)."""
    params = docstring_parser.parse(documented.__doc__ or "").params
    return {param.arg_name: " ".join((param.description or "").split()) for param in params if param.args[0] == section}


def _field_default(item: dataclasses.Field[Any]) -> Any:
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return item.default
