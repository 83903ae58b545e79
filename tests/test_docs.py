"""The docs: the site builds strictly, the README stays short and true to its example, charts match their data."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from benchmarks._charts import LABEL_SIZE, ChartData, render_svg, text_width
from benchmarks.render_charts import main as render_charts

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
MAKEFILE = REPO_ROOT / "Makefile"
DEVELOPMENT = REPO_ROOT / "docs" / "development.md"
OWN_TASK = REPO_ROOT / "workflows" / "own_task.py"
BENCHMARK_PAGES = REPO_ROOT / "docs" / "benchmarks"
SVG = "{http://www.w3.org/2000/svg}"
WRITERS = ("write_chart_data(", "write_line_chart_data(")
"""How a benchmark writes its chart's data: bars, or a sweep's lines."""


def writes_chart_data(script: Path) -> bool:
    text = script.read_text(encoding="utf-8")
    return any(writer in text for writer in WRITERS)


def benchmark_pages() -> list[Path]:
    return sorted(page for page in BENCHMARK_PAGES.glob("*.md") if page.name != "index.md")


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs extra has it)")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "api" / "batcher" / "index.html").is_file()


def test_the_readme_has_at_most_300_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_the_readme_own_task_example_is_workflows_own_task() -> None:
    readme = README.read_text(encoding="utf-8")
    section = readme.split("\n### Your own task\n", 1)[1]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert blocks, "no python block under '### Your own task'"
    source = OWN_TASK.read_text(encoding="utf-8")
    docstring = ast.parse(source).body[0]
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
    after_docstring = "\n".join(source.splitlines()[docstring.end_lineno :])
    assert blocks[0].strip() == after_docstring.strip()


@pytest.mark.parametrize("page", benchmark_pages(), ids=lambda page: page.stem)
def test_every_benchmark_page_embeds_its_chart_drawn_by_its_benchmark(page: Path) -> None:
    assert f"](charts/{page.stem}.svg)" in page.read_text(encoding="utf-8")
    assert (BENCHMARK_PAGES / "charts" / f"{page.stem}.svg").is_file()
    assert (BENCHMARK_PAGES / "data" / f"{page.stem}.json").is_file()
    script = REPO_ROOT / "benchmarks" / f"bench_{page.stem}.py"
    assert writes_chart_data(script), f"{script.name} takes no --chart-data"


def test_every_benchmark_script_can_write_its_chart_data() -> None:
    scripts = sorted((REPO_ROOT / "benchmarks").glob("bench_*.py"))
    assert scripts
    lacking = [
        script.name for script in scripts if not any(writer in script.read_text(encoding="utf-8") for writer in WRITERS)
    ]
    assert lacking == []


def make_targets() -> set[str]:
    """The Makefile's targets that a user runs (not the files it makes)."""
    return set(re.findall(r"^([a-z][a-z0-9-]*):", MAKEFILE.read_text(encoding="utf-8"), re.MULTILINE))


def test_every_benchmark_script_runs_from_a_make_target() -> None:
    makefile = MAKEFILE.read_text(encoding="utf-8")
    scripts = [
        script.name
        for script in (REPO_ROOT / "benchmarks").glob("*.py")
        if not script.name.startswith("_") and 'if __name__ == "__main__":' in script.read_text(encoding="utf-8")
    ]
    assert len(scripts) > 20
    unreachable = sorted(name for name in scripts if f"benchmarks/{name}" not in makefile)
    assert unreachable == [], f"no make target runs {unreachable}"


def test_the_development_page_lists_every_make_target() -> None:
    table = DEVELOPMENT.read_text(encoding="utf-8").split("## Make targets", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `make ([a-z][a-z0-9-]*)", table, re.MULTILINE))
    targets = make_targets()
    assert listed == targets, f"not on the page: {targets - listed}; not in the Makefile: {listed - targets}"


def test_render_charts_regenerates_the_committed_svgs(tmp_path: Path) -> None:
    render_charts(["--out-dir", str(tmp_path)])
    committed = {path.name: path.read_bytes() for path in (BENCHMARK_PAGES / "charts").glob("*.svg")}
    drawn = {path.name: path.read_bytes() for path in tmp_path.glob("*.svg")}
    assert sorted(drawn) == sorted(committed)
    stale = [name for name in drawn if drawn[name] != committed[name]]
    assert stale == [], f"run `python benchmarks/render_charts.py`: {stale} differ from their data"


@pytest.mark.parametrize("chart", sorted((BENCHMARK_PAGES / "charts").glob("*.svg")), ids=lambda path: path.stem)
def test_every_chart_label_fits_inside_the_chart(chart: Path) -> None:
    root = ElementTree.fromstring(chart.read_text(encoding="utf-8"))
    width = float(root.attrib["width"])
    texts = list(root.iter(f"{SVG}text"))
    assert texts
    for text in texts:
        x, size = float(text.attrib["x"]), float(text.attrib["font-size"])
        extent = text_width(text.text or "", size)
        anchor = text.attrib.get("text-anchor", "start")
        left = {"end": x - extent, "middle": x - extent / 2}.get(anchor, x)
        right = left + extent
        assert left >= 0 and right <= width, f"{chart.name}: {text.text!r} does not fit"


def test_a_long_label_widens_the_label_column_and_values_keep_their_digits() -> None:
    label = "a label much longer than any other, which must still fit in its box"
    svg = render_svg(ChartData("Title", "unit", ((label, 3.0), ("short", 12.345)), digits=2))
    root = ElementTree.fromstring(svg)
    texts = {text.text: text for text in root.iter(f"{SVG}text")}
    assert float(texts[label].attrib["x"]) >= text_width(label, LABEL_SIZE)
    assert "12.35" in texts and "3.00" in texts
