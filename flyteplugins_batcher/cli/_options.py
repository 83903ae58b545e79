"""Command-line options derived from what the jobs and the server declare: one flag per input or setting.

The jobs declare their inputs once (`flyteplugins_batcher/jobs/_options.py` spreads the option
dataclasses into a task's signature, with help from their docstrings), and the server its settings
(`ServerSettings`, `EngineSettings`). The commands read those, so a setting added there is a flag
of every command that takes it, with the same default and help.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import rich_click as click

from flyteplugins_batcher.jobs import DeclaredOption

OptionDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]

VARIADIC_FLAGS = ("--lora-modules", "--model")
"""Options that take several values (vLLM's `--lora-modules a=/x b=/y`; `--model` given more than once, for a file
that names several base models): their values are joined by new lines."""


class VLLMStyleCommand(click.RichCommand):
    """A command that takes vLLM's variadic options as vLLM's command line writes them (see `join_variadic`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, join_variadic(args))


def join_variadic(args: list[str]) -> list[str]:
    """`args` with each variadic flag's values (every occurrence, and the words after it that are not flags) as one.

    Example:
        ```python
        args = ["--lora-modules", "a=/x", "b=/y", "-o", "o"]
        assert join_variadic(args) == ["-o", "o", "--lora-modules", "a=/x\\nb=/y"]
        ```
    """
    rest: list[str] = []
    values: dict[str, list[str]] = {}
    position = 0
    while position < len(args):
        flag, _, inline = args[position].partition("=")
        position += 1
        if flag not in VARIADIC_FLAGS:
            rest.append(args[position - 1])
            continue
        found = values.setdefault(flag, [])
        found += [inline] if inline else []
        while position < len(args) and not args[position].startswith("-"):
            found.append(args[position])
            position += 1
    return rest + [part for flag, found in values.items() for part in (flag, "\n".join(found))]


def accepted_vllm_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Flags of vLLM's that a command accepts and needs no value for here: `--enable-auto-tool-choice` (tool
    choice "auto" needs only `--tool-call-parser` here)."""
    return click.option(
        "--enable-auto-tool-choice",
        "enable_auto_tool_choice",
        is_flag=True,
        default=False,
        show_default="off",
        help="Accepted as vLLM takes it; tool_choice 'auto' needs only --tool-call-parser here.",
    )(command)


def flag_name(name: str) -> str:
    """`max_model_len` -> `--max-model-len` (vLLM's spelling of its own options)."""
    return f"--{name.replace('_', '-')}"


def option_for(option: DeclaredOption) -> click.Option:
    """A click option: bools as `--x/--no-x`, `int | None` as an optional int, the rest as typed."""
    flag, shown = flag_name(option.name), True if option.default is not None else "none"
    if option.kind is bool:
        names = [f"{flag}/--no-{flag[2:]}", option.name]
        return click.Option(names, default=option.default, help=option.help, show_default=shown)
    kind = option.kind if option.kind in (int, float, str) else str
    return click.Option([flag, option.name], type=kind, default=option.default, help=option.help, show_default=shown)


def input_options(func: Callable[..., Any], *, skip: Iterable[str] = ()) -> OptionDecorator:
    """One option per input of `func` (a job's spread task function), less `skip`, with its default."""
    skipped = set(skip)
    return _attach(option_for(option) for option in DeclaredOption.inputs_of(func) if option.name not in skipped)


def setting_options(*classes: type) -> OptionDecorator:
    """One option per field of the settings dataclasses, with the field's default and help.

    A field that holds settings of its own (`ServerSettings.engine`) is not an option: pass its
    class too. Which options the command line gave, `given_on_command_line` tells: the rest keep
    what the settings read from the environment (`BATCH_SERVE_*`), else their defaults.
    """
    return _attach(
        option_for(option)
        for cls in classes
        for option in DeclaredOption.fields_of(cls)
        if not dataclasses.is_dataclass(option.kind)
    )


def given_on_command_line(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The options the command line set, not those left at their defaults."""
    return {
        name: value
        for name, value in values.items()
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    }


def given(values: dict[str, Any], func: Callable[..., Any]) -> dict[str, Any]:
    """The options that are inputs of `func` (the job), as its keywords."""
    names = set(inspect.signature(func).parameters)
    return {name: value for name, value in values.items() if name in names}


def _attach(options: Iterable[click.Option]) -> OptionDecorator:
    listed = list(options)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        # What `@click.option` does: options gathered on the function, in reverse, for `@click.command`.
        command.__click_params__ = [*getattr(command, "__click_params__", []), *reversed(listed)]  # type: ignore[attr-defined]
        return command

    return decorate
