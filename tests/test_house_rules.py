"""The house rules that a reviewer would otherwise check by hand: ruff, and the size of classes and functions."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("flyteplugins_batcher", "workflows", "benchmarks", "images", "tests")
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 50
"""Lines of a function, its signature included and its docstring aside."""


def ruff(*arguments: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if executable is None:
        pytest.skip("ruff is not installed (the test extra has it)")
    return subprocess.run([executable, *arguments], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing_to_fix() -> None:
    checked = ruff("check", ".")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_ruff_would_reformat_nothing() -> None:
    formatted = ruff("format", "--check", ".")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


def oversized(tree: ast.AST, path: Path) -> Iterator[str]:
    """The classes and functions in `tree` over the size limits, each as `path:line name (lines)`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_CLASS_LINES:
                yield f"{path}:{node.lineno} class {node.name} ({lines} lines)"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # From `def` to its last line, signature included, less its docstring.
            documented = ast.get_docstring(node) is not None
            docstring = node.body[0].end_lineno - node.body[0].lineno + 1 if documented else 0
            lines = node.end_lineno - node.lineno + 1 - docstring
            if lines > MAX_FUNCTION_LINES:
                yield f"{path}:{node.lineno} def {node.name} ({lines} lines)"


def test_no_class_over_300_lines_and_no_function_over_50() -> None:
    found = [
        problem
        for folder in CHECKED
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        for problem in oversized(ast.parse(path.read_text(), str(path)), path.relative_to(REPO_ROOT))
    ]
    assert found == []


def test_the_size_check_can_fail() -> None:
    long_function = "def f():\n    '''Doc.'''\n" + "    x = 1\n" * 50
    short_function = "def g():\n    '''Doc.\n\n    More.\n    '''\n" + "    x = 1\n" * 49
    long_signature = "def h(\n" + "    a: int,\n" * 10 + "):\n" + "    x = 1\n" * 40

    assert [problem.split(" (")[0] for problem in oversized(ast.parse(long_function), Path("m.py"))] == ["m.py:1 def f"]
    assert list(oversized(ast.parse(short_function), Path("m.py"))) == []
    assert [problem.split(" (")[0] for problem in oversized(ast.parse(long_signature), Path("m.py"))] == [
        "m.py:1 def h"
    ]
