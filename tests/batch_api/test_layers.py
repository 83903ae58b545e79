"""The format layer reads from the bottom up: no module of `batch_api` imports one that imports it back."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import flyteplugins_batcher.batch_api as batch_api

PACKAGE = Path(batch_api.__file__).parent
PREFIX = "flyteplugins_batcher.batch_api."


def imports_within_the_package(path: Path) -> set[str]:
    """The package's own modules that `path` imports, type-checking imports included."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            modules.add(node.module.removeprefix(PREFIX))
    return modules


def test_the_modules_import_each_other_without_a_cycle():
    graph = {path.stem: imports_within_the_package(path) for path in PACKAGE.glob("_*.py")}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise AssertionError(f"batch_api modules import each other in a circle: {error.args[1]}") from None
    assert order.index("_lines") < order.index("_responses") and order.index("_requests") < order.index("_responses")
