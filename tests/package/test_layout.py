"""The package stands alone: nothing in it reaches into the repository, and the examples only import it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "flyteplugins_batcher"
REPOSITORY_ONLY = ("workflows", "images", "tests", "benchmarks")
EXAMPLE_MAX_LINES = 60


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_of_the_package_imports_the_repository():
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_roots(path) & set(REPOSITORY_ONLY))
        for path in PACKAGE.rglob("*.py")
    }
    assert {path: roots for path, roots in offenders.items() if roots} == {}


def test_the_check_can_fail(tmp_path: Path):
    module = tmp_path / "bad.py"
    module.write_text("from workflows.driver import fan_out\nimport images\n")
    assert imported_roots(module) & set(REPOSITORY_ONLY) == {"workflows", "images"}


@pytest.mark.parametrize("example", sorted((REPO_ROOT / "workflows").glob("*.py")), ids=lambda path: path.name)
def test_each_example_is_short_and_imports_the_package(example: Path):
    assert len(example.read_text().splitlines()) <= EXAMPLE_MAX_LINES
    assert "flyteplugins_batcher" in imported_roots(example)


def test_the_samples_the_jobs_read_ship_in_the_wheel():
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert '"jobs/data/*.jsonl"' in pyproject
    assert sorted(path.name for path in (PACKAGE / "jobs" / "data").glob("*.jsonl")) == [
        "embed_sample.jsonl",
        "gsm8k_sample.jsonl",
    ]
