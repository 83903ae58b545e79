"""The house's figures at given revisions, as a markdown table (issue 41's before and after).

Each figure is read from the revision's committed files (`git cat-file`, as `git show REV:path` would),
so any commit can be measured without checking it out; `WORKTREE` measures the files as they are now.

- **lines**, **modules**: the package's Python files (`flyteplugins_batcher/**/*.py`) and their lines, blank
  lines, comments and docstrings included (what `find flyteplugins_batcher -name '*.py' | xargs cat | wc -l` says).
- **exception classes**: classes of the package that derive, through the package's own classes, from a
  built-in exception or from a class whose name ends in `Error` or `Exception` (warnings left out).
- **request shapes**: how many of `BatchRequest`, `RequestItem`, `Request`, `PreparedPrompt` the package
  defines, and how many of `GenerationConfig`'s fields `RequestItem` declares again (copies).
- **dead definitions**: functions, methods and classes of the package whose name occurs nowhere but in
  their own definitions, across the package, `tests/`, `benchmarks/`, `workflows/`, `images/`, `docs/`
  (not `docs/development.md`, which reports them) and the README. Left out: dunder names, functions
  under a decorator that is a call (a route, a command), and names defined by a protocol the package
  answers (vLLM's `log_engine_initialized`, click's `list_commands`, `get_command`). A name defined
  twice and used once elsewhere is not counted: this is a floor, not vulture's fuller list.
- **benchmark setup lines**: in `benchmarks/`, the lines that set a benchmark up rather than measure:
  the repository-root header (`REPO_ROOT = ...`, `sys.path` edits) in the scripts outside the shared
  harness modules (`_*.py`), `argparse` parsers and `add_argument` calls for flags the harness declares
  once (`--data`, `--rounds`, `--json`, `--quick`, ...), and every copy past the first of a top-level
  function that two or more benchmark files define to the letter (the same syntax tree).

    python benchmarks/house_figures.py 75d6b41 b613641 HEAD
    python benchmarks/house_figures.py --label before=75d6b41 --label now=WORKTREE
"""

from __future__ import annotations

import argparse
import ast
import builtins
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "flyteplugins_batcher"
WORKTREE = "WORKTREE"
NAME_SOURCES = (PACKAGE, "tests", "benchmarks", "workflows", "images", "docs", "README.md")
REQUEST_SHAPES = ("BatchRequest", "RequestItem", "Request", "PreparedPrompt")
COMMON_FLAGS = (
    "--data",
    "--rounds",
    "--json",
    "--quick",
    "--threads",
    "--time-scale",
    "--model",
    "--dtype",
    "--max-model-len",
    "--max-num-seqs",
    "--kv-cache-gb",
    "--enforce-eager",
    "--chart-data",
)
PROTOCOL_NAMES = {"log_engine_initialized", "list_commands", "get_command"}
FIGURES_PAGE = "docs/development.md"
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def files_at(revision: str, roots: tuple[str, ...]) -> dict[str, str]:
    """Every text file under `roots` at `revision` (or in the working tree), by path."""
    if revision == WORKTREE:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *roots],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return {path: (REPO_ROOT / path).read_text(errors="replace") for path in listed if (REPO_ROOT / path).is_file()}
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", revision, "--", *roots],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    wanted = [path for path in listed if path.endswith((".py", ".md"))]
    batch = subprocess.run(
        ["git", "cat-file", "--batch"],
        cwd=REPO_ROOT,
        input="".join(f"{revision}:{path}\n" for path in wanted).encode(),
        capture_output=True,
        check=True,
    ).stdout
    texts: dict[str, str] = {}
    position = 0
    for path in wanted:
        header_end = batch.index(b"\n", position)
        size = int(batch[position:header_end].split()[2])
        texts[path] = batch[header_end + 1 : header_end + 1 + size].decode(errors="replace")
        position = header_end + 1 + size + 1
    return texts


def parsed(texts: dict[str, str]) -> dict[str, ast.Module]:
    """The Python files among `texts` that parse."""
    trees = {}
    for path, text in texts.items():
        if path.endswith(".py"):
            try:
                trees[path] = ast.parse(text)
            except SyntaxError:
                continue
    return trees


def base_name(node: ast.expr) -> str:
    """A base class's own name: `Error` for `Error`, `httpx.HTTPError` -> `HTTPError`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return base_name(node.value)
    return node.id if isinstance(node, ast.Name) else ""


def is_builtin_exception(name: str) -> bool:
    """Whether `name` is a built-in exception (warnings are not counted: they are not raised as errors)."""
    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, BaseException) and not issubclass(found, Warning)


def exception_classes(trees: dict[str, ast.Module]) -> set[str]:
    """The package's exception classes, as `path:Name`, found by following bases to a fixed point."""
    classes = [
        (path, node.name, [base_name(base) for base in node.bases])
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]
    ours = {name for _, name, _ in classes}
    exceptional: set[str] = set()
    changed = True
    while changed:
        changed = False
        for _, name, bases in classes:
            if name in exceptional:
                continue
            for base in bases:
                foreign = base not in ours and (base.endswith(("Error", "Exception")) or is_builtin_exception(base))
                if base in exceptional or foreign:
                    exceptional.add(name)
                    changed = True
                    break
    return {f"{path}:{name}" for path, name, _ in classes if name in exceptional}


def annotated_fields(trees: dict[str, ast.Module], class_name: str) -> set[str]:
    """The annotated fields of the package's class `class_name` (empty if it has none)."""
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return {
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
    return set()


def request_shapes(trees: dict[str, ast.Module]) -> str:
    """`shapes / copied fields`: the request shapes defined, the `GenerationConfig` fields `RequestItem` repeats."""
    defined = {node.name for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    copied = annotated_fields(trees, "RequestItem") & annotated_fields(trees, "GenerationConfig")
    return f"{sum(shape in defined for shape in REQUEST_SHAPES)} / {len(copied)} copied fields"


def definitions(tree: ast.Module) -> list[str]:
    """The names a module defines with `def` or `class`, less those a framework or protocol calls."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(isinstance(decorator, ast.Call) for decorator in node.decorator_list):
                continue
        elif not isinstance(node, ast.ClassDef):
            continue
        if not (node.name.startswith("__") and node.name.endswith("__")) and node.name not in PROTOCOL_NAMES:
            names.append(node.name)
    return names


def dead_definitions(texts: dict[str, str], trees: dict[str, ast.Module]) -> list[str]:
    """The package's definitions whose name is written nowhere but where it is defined."""
    # The page that reports these figures names the dead definitions: it does not use them.
    read = [text for path, text in texts.items() if path != FIGURES_PAGE]
    words = Counter(word for text in read for word in WORD.findall(text))
    defined = Counter(name for path, tree in trees.items() if path.startswith(PACKAGE) for name in definitions(tree))
    return sorted(name for name, count in defined.items() if words[name] <= count)


def statement_lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def is_root_header(node: ast.stmt) -> bool:
    """`REPO_ROOT = ...`, or a statement that edits `sys.path` (a docstring that names it is no header)."""
    if not isinstance(node, (ast.Assign, ast.If, ast.Expr)) or isinstance(getattr(node, "value", None), ast.Constant):
        return False
    text = ast.unparse(node)
    targets = node.targets if isinstance(node, ast.Assign) else []
    named_root = any(isinstance(target, ast.Name) and target.id in ("REPO_ROOT", "ROOT") for target in targets)
    return named_root or "sys.path" in text


def parser_lines(tree: ast.Module) -> int:
    """Lines of `ArgumentParser(...)` calls and of `add_argument` calls for a flag the harness declares once."""
    lines = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute | ast.Name):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        flags = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        if called == "ArgumentParser" or (called == "add_argument" and set(flags) & set(COMMON_FLAGS)):
            lines += statement_lines(node)
    return lines


def benchmark_setup_lines(trees: dict[str, ast.Module]) -> int:
    """The benchmarks' setup lines: root headers, common flags parsed again, helpers defined in several files."""
    benchmarks = {path: tree for path, tree in trees.items() if path.startswith("benchmarks/")}
    scripts = {path: tree for path, tree in benchmarks.items() if not Path(path).name.startswith("_")}
    headers = sum(statement_lines(node) for tree in scripts.values() for node in tree.body if is_root_header(node))
    copies: dict[str, list[int]] = {}
    for tree in benchmarks.values():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                copies.setdefault(ast.dump(node), []).append(statement_lines(node))
    repeated = sum(sum(sizes[1:]) for sizes in copies.values())
    return headers + sum(parser_lines(tree) for tree in scripts.values()) + repeated


def figures(revision: str) -> dict[str, str]:
    """Every figure of the table at `revision`."""
    texts = files_at(revision, NAME_SOURCES)
    trees = parsed(texts)
    package = {path: text for path, text in texts.items() if path.startswith(f"{PACKAGE}/") and path.endswith(".py")}
    package_trees = {path: tree for path, tree in trees.items() if path in package}
    dead = dead_definitions(texts, trees)
    return {
        "lines": f"{sum(len(text.splitlines()) for text in package.values()):,}",
        "modules": str(len(package)),
        "exception classes": str(len(exception_classes(package_trees))),
        "request shapes": request_shapes(package_trees),
        "dead definitions": str(len(dead)),
        "benchmark setup lines": str(benchmark_setup_lines(trees)),
    }


def markdown(columns: list[tuple[str, dict[str, str]]]) -> str:
    """The figures as a markdown table, one column a revision."""
    header = "| figure | " + " | ".join(label for label, _ in columns) + " |"
    rule = "|---|" + "---|" * len(columns)
    rows = [f"| {name} | " + " | ".join(values[name] for _, values in columns) + " |" for name in columns[0][1]]
    return "\n".join([header, rule, *rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revisions", nargs="*", help=f"git revisions, or {WORKTREE} for the files as they are")
    parser.add_argument("--label", action="append", default=[], help="LABEL=REV: a column with a label of its own")
    parser.add_argument("--dead", action="store_true", help="also list each revision's dead definitions")
    args = parser.parse_args(argv)
    wanted = [(revision, revision) for revision in args.revisions]
    wanted += [tuple(pair.split("=", 1)) for pair in args.label]
    if not wanted:
        parser.error("name at least one revision")
    print(markdown([(label, figures(revision)) for label, revision in wanted]))
    if args.dead:
        for label, revision in wanted:
            texts = files_at(revision, NAME_SOURCES)
            print(f"\n{label}: " + ", ".join(dead_definitions(texts, parsed(texts))))


if __name__ == "__main__":
    sys.exit(main())
