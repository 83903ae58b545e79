"""The package's errors: one root, `BatcherError`, and the tree drawn in `_errors.py` is the tree in the code.

Read from the source, as the layer test reads imports: a class is an error when its bases lead, by
name, through the package's classes to one of Python's built-in exceptions. Warnings are not
errors. Every error descends from `BatcherError` through one chain of the package's own classes
(it may keep a built-in class beside it, as `InvalidPromptError` keeps `ValueError`), and the
drawing in `flyteplugins_batcher/_errors.py` names each one, where it is imported from, and the
built-in class it is besides (a private class, which never reaches a caller, aside).
"""

from __future__ import annotations

import ast
import builtins
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.package.test_layers import PACKAGE, RANKS, ROOT, module_names, part_of, public_packages, write_package

ROOT_ERROR = "BatcherError"
DRAWING_MODULE = "_errors.py"


@dataclass(frozen=True)
class ErrorClass:
    """One exception class of the package: its name, module, line and the names of its bases."""

    name: str
    module: str
    line: int
    bases: tuple[str, ...]

    @property
    def builtin_bases(self) -> tuple[str, ...]:
        """The built-in exceptions it names as bases, `Exception` aside."""
        return tuple(base for base in self.bases if _builtin_exception(base) and base != "Exception")


def _builtin_exception(name: str) -> type[BaseException] | None:
    value = getattr(builtins, name, None)
    return value if isinstance(value, type) and issubclass(value, BaseException) else None


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def error_classes(package: Path = PACKAGE, root: str = ROOT) -> list[ErrorClass]:
    """Every exception class the package defines (warnings aside), in no particular order."""
    classes = [
        ErrorClass(node.name, module, node.lineno, tuple(_base_name(base) for base in node.bases))
        for module, path in module_names(package, root).items()
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef)
    ]
    by_name = {found.name: found for found in classes}

    def kind(name: str, seen: frozenset[str] = frozenset()) -> str:
        builtin = _builtin_exception(name)
        if builtin is not None:
            return "warning" if issubclass(builtin, Warning) else "error"
        if name not in by_name or name in seen:
            return ""
        kinds = {kind(base, seen | {name}) for base in by_name[name].bases}
        return "warning" if "warning" in kinds else "error" if "error" in kinds else ""

    return [found for found in classes if kind(found.name) == "error"]


def exported_from(package: Path = PACKAGE, root: str = ROOT) -> dict[str, str]:
    """Each exported name, by the public package whose `__all__` lists it."""
    modules = module_names(package, root)
    exported = {}
    for name in public_packages(package, root):
        for node in ast.parse(modules[name].read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(getattr(target, "id", "") == "__all__" for target in node.targets):
                exported.update(dict.fromkeys(ast.literal_eval(node.value), name))
    return exported


def strays(errors: list[ErrorClass], root_error: str = ROOT_ERROR) -> list[str]:
    """Errors that do not descend from the root through exactly one chain of the package's classes."""
    by_name = {found.name: found for found in errors}
    problems = []
    for found in errors:
        if found.name == root_error:
            continue
        chain, current = [found.name], found
        while True:
            parents = [base for base in current.bases if base in by_name]
            if len(parents) != 1:
                problems.append(f"{found.module}.{found.name}: {' < '.join(chain)} has package bases {parents}")
                break
            if parents[0] == root_error:
                break
            chain.append(parents[0])
            current = by_name[parents[0]]
    return problems


def twice_named(errors: list[ErrorClass]) -> list[str]:
    """Error names that more than one class uses: one name, one error."""
    modules = defaultdict(list)
    for found in errors:
        modules[found.name].append(found.module)
    return sorted(f"{name}: {places}" for name, places in modules.items() if len(places) > 1)


def drawing(errors: list[ErrorClass], exported: dict[str, str], root_error: str = ROOT_ERROR) -> str:
    """The tree of errors under the root: each with where it is imported from, and its built-in classes.

    A private class (`_Fatal`, which carries an error out of a runner and never reaches a caller) is left out.
    """
    errors = [found for found in errors if not found.name.startswith("_")]
    by_name = {found.name: found for found in errors}
    children: dict[str, list[ErrorClass]] = defaultdict(list)
    for found in errors:
        parents = [base for base in found.bases if base in by_name]
        if parents:
            children[parents[0]].append(found)

    def label(found: ErrorClass, prefix: str) -> str:
        where = f"from {exported[found.name]}" if found.name in exported else f"{part_of(found.module)}, not exported"
        also = f"  (also {', '.join(found.builtin_bases)})" if found.builtin_bases else ""
        return f"{prefix + found.name:<44}{where}{also}".rstrip()

    lines = [label(by_name[root_error], "")]

    def draw(parent: str, indent: str) -> None:
        kids = sorted(children[parent], key=lambda kid: (RANKS[part_of(kid.module)], kid.module, kid.line))
        for index, kid in enumerate(kids):
            last = index == len(kids) - 1
            lines.append(label(kid, indent + ("└── " if last else "├── ")))
            draw(kid.name, indent + ("    " if last else "│   "))

    draw(root_error, "")
    return "\n".join(lines)


def drawn(package: Path = PACKAGE) -> str:
    """The tree as `_errors.py`'s docstring draws it: its first ```text block."""
    docstring = ast.get_docstring(ast.parse((package / DRAWING_MODULE).read_text(encoding="utf-8"))) or ""
    found = re.search(r"^```text\n(.*?)^```", docstring, re.DOTALL | re.MULTILINE)
    return found.group(1).rstrip() if found else ""


# -- the package keeps the rules ---------------------------------------------------------------------------------


def test_every_error_of_the_package_descends_from_batcher_error() -> None:
    assert strays(error_classes()) == []


def test_no_two_errors_share_a_name() -> None:
    assert twice_named(error_classes()) == []


def test_the_drawing_in_errors_py_is_the_tree_in_the_code() -> None:
    expected = drawing(error_classes(), exported_from())
    assert drawn() == expected, f"draw it again in {DRAWING_MODULE}'s docstring:\n\n{expected}"


def test_the_errors_page_names_every_error_a_user_can_import() -> None:
    page = (PACKAGE.parent / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    exported = exported_from()
    public = sorted(found.name for found in error_classes() if found.name in exported)
    assert [name for name in public if f"[`{name}`][{exported[name]}.{name}]" not in page] == []


def test_an_error_keeps_the_builtin_class_its_callers_catch() -> None:
    import flyteplugins_batcher as core
    from flyteplugins_batcher import batch_api, engines, jobs

    kept = {
        core.QueueFullError: RuntimeError,
        core.UnrecoverableError: RuntimeError,
        core.RecordExpiredError: TimeoutError,
        core.CostBudgetExceededError: ValueError,
        engines.InvalidPromptError: ValueError,
        engines.ModelNotFoundError: FileNotFoundError,
        engines.InvalidModelReferenceError: ValueError,
        engines.EmptyDocumentError: ValueError,
        batch_api.JSONBoundsError: ValueError,
        jobs.UnrecoverableRunError: RuntimeError,
    }
    assert all(issubclass(error, core.BatcherError) and issubclass(error, builtin) for error, builtin in kept.items())


# -- each rule can fail ------------------------------------------------------------------------------------------


def test_the_rules_catch_a_stray_error_a_second_root_and_a_stale_drawing(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "from pkg._errors import BatcherError\n__all__ = ['BatcherError']\n",
            "_errors.py": "class BatcherError(Exception): ...\nclass Closed(BatcherError, RuntimeError): ...\n",
            "late.py": "from pkg._errors import Closed\nclass Slow(UserWarning): ...\nclass Later(Closed): ...\n"
            "class _Carrier(BatcherError): ...\n",
            "stray.py": "class Stray(ValueError): ...\nclass Twice(BatcherError, Stray): ...\n",
        },
    )
    errors = error_classes(package, "pkg")
    assert sorted(found.name for found in errors) == ["BatcherError", "Closed", "Later", "Stray", "Twice", "_Carrier"]
    assert [problem.split(":")[0] for problem in strays(errors)] == ["pkg.stray.Stray", "pkg.stray.Twice"]
    kept = [found for found in errors if found.module != "pkg.stray"]
    assert drawing(kept, exported_from(package, "pkg")) == (
        f"{'BatcherError':<44}from pkg\n"
        f"{'└── Closed':<44}core, not exported  (also RuntimeError)\n"
        f"{'    └── Later':<44}core, not exported"
    )
    assert drawn(package) == ""  # no drawing at all: the package test would fail
    assert twice_named([*errors, ErrorClass("Closed", "pkg.other", 1, ("BatcherError",))]) != []
