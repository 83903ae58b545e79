"""The house in layers, read from the source: no import cycle, parts meet through their public faces, in order.

Every import counts, at module level, under `TYPE_CHECKING` and inside functions alike: a lazy
import is still a dependency, only a later one. The parts and their order, highest first:

    cli > server > jobs > replica > batch_api > engines, images > core

A part imports only parts below it, and only their public face: the part's package (for the core,
`flyteplugins_batcher` itself) or a public subpackage of it (`flyteplugins_batcher.engines.vllm`),
never a module or folder whose name starts with `_`. Inside a part, anything goes but a cycle, except
in the core, which has floors of its own (`CORE_FLOORS`), highest first:

    the package's face > _process > _batcher, _token_batcher > _pipeline > _measure > _types, _errors, _settings, ...

Each public package's `__all__` names what it exports, no more and no less (as httpx's
`test_exported_members` checks).
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import flyteplugins_batcher

PACKAGE = Path(flyteplugins_batcher.__file__).parent
ROOT = "flyteplugins_batcher"
RANKS = {"core": 0, "engines": 1, "images": 1, "batch_api": 2, "replica": 3, "jobs": 4, "server": 5, "cli": 6}
"""Each part's place: a part may import only parts of a lower rank."""
CORE_FLOORS = {
    "_types": 0,
    "_errors": 0,
    "_settings": 0,
    "_keywords": 0,
    "_deprecation": 0,
    "_version": 0,
    "_measure": 1,
    "_pipeline": 2,
    "_batcher": 3,
    "_token_batcher": 3,
    "_process": 4,
}
"""The core's floors, by its top private module or folder: a core module imports only its floor and those below.

What every floor shares (record types, errors, settings) < what the batcher measured < a record's way
< the batchers over it < what lives once per process; the package's `__init__`, its face, is above them all.
"""


@dataclass(frozen=True)
class Import:
    """One import of a package module by another: who, what, and on which line."""

    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def module_names(package: Path, root: str = ROOT) -> dict[str, Path]:
    """Every module of the package under `package`, by dotted name."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = [root, *path.relative_to(package).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path], root: str = ROOT) -> Iterator[Import]:
    """The package modules that the module `name` imports, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, node, is_package)
            # `from package import module` imports the module; `from module import name`, the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == root and target in modules and target != name:
                yield Import(name, target, node.lineno)


def _absolute(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def package_imports(package: Path = PACKAGE, root: str = ROOT) -> list[Import]:
    modules = module_names(package, root)
    return [found for name, path in modules.items() for found in imports_of(name, path, modules, root)]


def part_of(module: str) -> str:
    """The part a module belongs to: `engines`, ..., or `core` for the top package and its private modules."""
    parts = module.split(".")
    if parts[1:] == ["__main__"]:
        return "cli"  # `python -m flyteplugins_batcher` is the command line
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else "core"


def is_public_face(module: str) -> bool:
    """Whether `module` is a public package or module: no name along its path starts with `_`."""
    return not any(part.startswith("_") for part in module.split(".")[1:])


def floor_of(module: str) -> int | None:
    """A core module's floor (`CORE_FLOORS`); the package itself stands above every floor; `None`: it has none."""
    parts = module.split(".")
    return CORE_FLOORS.get(parts[1]) if len(parts) > 1 else max(CORE_FLOORS.values()) + 1


def cycles(imports: list[Import]) -> list[str]:
    graph: dict[str, set[str]] = {}
    for found in imports:
        graph.setdefault(found.importer, set()).add(found.imported)
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        return [" -> ".join(error.args[1])]
    return []


def private_reaches(imports: list[Import]) -> list[str]:
    return [
        str(found)
        for found in imports
        if part_of(found.importer) != part_of(found.imported) and not is_public_face(found.imported)
    ]


def upward_imports(imports: list[Import]) -> list[str]:
    return [
        f"{found} ({part_of(found.importer)} may not import {part_of(found.imported)})"
        for found in imports
        if part_of(found.importer) != part_of(found.imported)
        and RANKS[part_of(found.importer)] <= RANKS[part_of(found.imported)]
    ]


def core_climbs(imports: list[Import]) -> list[str]:
    """Imports inside the core from a lower floor to a higher one."""
    climbs = []
    for found in imports:
        if part_of(found.importer) == part_of(found.imported) == "core":
            below, above = floor_of(found.importer), floor_of(found.imported)
            if below is not None and above is not None and below < above:
                climbs.append(f"{found} (floor {below} may not import floor {above})")
    return climbs


def export_mismatches(module: types.ModuleType) -> list[str]:
    """Names `__all__` lists that the module lacks, and public names it defines that `__all__` leaves out."""
    exported = set(getattr(module, "__all__", ()))
    missing = [
        f"{module.__name__}.__all__ names {name}, which it lacks" for name in exported if not hasattr(module, name)
    ]
    unlisted = [
        f"{module.__name__}.{name} is public but not in __all__"
        for name, value in vars(module).items()
        if not name.startswith("_")
        and name not in exported
        and not isinstance(value, types.ModuleType)
        and (getattr(value, "__module__", "") or "").split(".")[0] == module.__name__.split(".")[0]
    ]
    return sorted(missing + unlisted)


def public_packages(package: Path = PACKAGE, root: str = ROOT) -> list[str]:
    return sorted(
        name
        for name, path in module_names(package, root).items()
        if path.name == "__init__.py" and is_public_face(name)
    )


# -- the package keeps the rules ---------------------------------------------------------------------------------


def test_no_import_cycle_in_the_package() -> None:
    assert cycles(package_imports()) == []


def test_a_part_imports_another_only_through_its_public_face() -> None:
    assert private_reaches(package_imports()) == []


def test_a_part_imports_only_the_parts_below_it() -> None:
    assert upward_imports(package_imports()) == []


def test_the_core_imports_only_its_own_floor_and_those_below() -> None:
    assert core_climbs(package_imports()) == []


def test_every_module_of_the_core_has_a_floor() -> None:
    core = [name for name in module_names(PACKAGE) if part_of(name) == "core"]
    assert [name for name in core if floor_of(name) is None] == []


def test_every_part_of_the_package_has_a_place_in_the_order() -> None:
    tops = {name.split(".")[1] for name in module_names(PACKAGE) if name.count(".") >= 1}
    public_tops = {top for top in tops if not top.startswith("_") and top != "__main__"}
    assert public_tops == set(RANKS) - {"core"}


@pytest.mark.parametrize("name", public_packages())
def test_each_public_packages_all_is_exactly_what_it_exports(name: str) -> None:
    assert export_mismatches(importlib.import_module(name)) == []


def test_the_public_surface_is_one_a_user_can_hold() -> None:
    sizes = {name: len(importlib.import_module(name).__all__) for name in public_packages()}
    assert sizes[f"{ROOT}.jobs"] <= 20 and sizes[f"{ROOT}.engines"] <= 35
    assert sum(sizes.values()) <= 150, sizes


# -- each rule can fail ------------------------------------------------------------------------------------------


def write_package(folder: Path, files: dict[str, str]) -> Path:
    """A package named `pkg` under `folder`, its modules given by relative path."""
    for relative, text in files.items():
        path = folder / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder / "pkg"


def test_the_cycle_rule_catches_a_lazy_import_that_closes_a_loop(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import thing\n",
            "b.py": "def thing():\n    from pkg import a  # lazy: still a dependency\n",
        },
    )
    assert cycles(package_imports(package, "pkg")) != []


def test_the_cycle_rule_catches_a_type_checking_import(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
        },
    )
    assert cycles(package_imports(package, "pkg")) != []


def test_the_face_rule_catches_a_reach_into_another_parts_private_module() -> None:
    reach = [Import("flyteplugins_batcher.server._http.app", "flyteplugins_batcher.jobs._driver", 3)]
    through_face = [Import("flyteplugins_batcher.server._http.app", "flyteplugins_batcher.jobs", 3)]
    into_core = [Import("flyteplugins_batcher.engines._base", "flyteplugins_batcher._settings", 5)]
    own_room = [Import("flyteplugins_batcher.server._http.app", "flyteplugins_batcher.server._state.store", 4)]
    assert private_reaches(reach) == [str(reach[0])] and private_reaches(into_core) == [str(into_core[0])]
    assert private_reaches(through_face) == [] and private_reaches(own_room) == []


def test_the_order_rule_catches_a_part_that_climbs() -> None:
    climbing = [Import("flyteplugins_batcher.server._execution.run_process", "flyteplugins_batcher.cli", 9)]
    sideways = [Import("flyteplugins_batcher.engines._base", "flyteplugins_batcher.images", 2)]
    down = [Import("flyteplugins_batcher.cli._serve", "flyteplugins_batcher.server", 1)]
    assert len(upward_imports(climbing)) == 1 and len(upward_imports(sideways)) == 1 and upward_imports(down) == []


def test_the_floor_rule_catches_the_core_climbing_inside_itself() -> None:
    core = "flyteplugins_batcher"
    measure_writes_pipeline = Import(f"{core}._measure.stats", f"{core}._pipeline.staging", 18)
    runner_reaches_process = Import(f"{core}._pipeline.runners", f"{core}._process.openmp", 32)
    down = [
        Import(f"{core}._pipeline.dispatch", f"{core}._measure.stats", 19),
        Import(f"{core}._process.batched", f"{core}._token_batcher", 17),
        Import(core, f"{core}._process.shared", 60),
        Import(f"{core}._token_batcher", f"{core}._batcher", 10),  # one floor
    ]
    assert core_climbs([measure_writes_pipeline, runner_reaches_process]) == [
        f"{measure_writes_pipeline} (floor 1 may not import floor 2)",
        f"{runner_reaches_process} (floor 2 may not import floor 4)",
    ]
    assert core_climbs([Import(f"{core}._types", core, 3)]) != []  # nothing below imports the face
    assert core_climbs(down) == []


def test_the_export_rule_catches_a_missing_name_and_an_unlisted_one() -> None:
    module = types.ModuleType("flyteplugins_batcher.fake")
    sys.modules[module.__name__] = module
    try:
        exec(  # a public name defined here, one missing from the module, and an import from elsewhere
            "from pathlib import Path\n__all__ = ['Listed', 'Missing']\nclass Listed: ...\nclass Unlisted: ...\n",
            vars(module),
        )
        assert export_mismatches(module) == [
            "flyteplugins_batcher.fake.Unlisted is public but not in __all__",
            "flyteplugins_batcher.fake.__all__ names Missing, which it lacks",
        ]
    finally:
        del sys.modules[module.__name__]
