"""The `batcher` command group; each command's module is imported only when that command runs.

Flyte's CLI loads every plugin's group when it starts (`flyte --help` included), so the group
itself imports nothing heavy: the jobs, the server and their dependencies load with the command.
"""

from __future__ import annotations

import importlib

import rich_click as click

COMMANDS = {
    "run-batch": ("flyteplugins_batcher.cli._run_batch", "run_batch", "Run an OpenAI-batch JSONL file locally."),
    "run-table": (
        "flyteplugins_batcher.cli._run_table",
        "run_table_command",
        "Answer (or embed) every row of a table locally.",
    ),
    "serve": ("flyteplugins_batcher.cli._serve", "serve", "Serve the OpenAI-compatible API on this machine."),
    "gsm8k": ("flyteplugins_batcher.cli._gsm8k", "gsm8k", "Solve gsm8k with batched LLM inference (the demo)."),
}


class LazyGroup(click.RichGroup):
    """A group whose commands are imported when one of them is looked up, not when the group is."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with their one-line summaries, without importing them."""
        listed = {name: click.Command(name, short_help=summary) for name, (_, _, summary) in COMMANDS.items()}
        click.RichGroup(self.name, commands=listed).format_commands(ctx, formatter)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flyteplugins-batcher", prog_name="flyteplugins-batcher")
def batcher() -> None:
    """Batch inference that keeps GPUs busy: run batch files and tables, serve the OpenAI API, or try it on gsm8k."""


def main() -> None:
    """The `flyteplugins-batcher` console script."""
    batcher(prog_name="flyteplugins-batcher")
