"""Draw the benchmark pages' charts: `docs/benchmarks/data/<bench>.json` -> `docs/benchmarks/charts/<bench>.svg`.

    python benchmarks/render_charts.py                      # every chart, in place
    python benchmarks/bench_embed.py --chart-data docs/benchmarks/data/embed.json && python benchmarks/render_charts.py

The committed SVGs must equal what this draws from the committed data (`tests/test_docs.py` checks it),
so a chart cannot go stale against its numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import ChartData, render_svg
from benchmarks._harness import REPO_ROOT, benchmark_parser
from benchmarks._line_charts import LineChartData, render_line_svg

DATA_DIR = REPO_ROOT / "docs" / "benchmarks" / "data"
CHART_DIR = REPO_ROOT / "docs" / "benchmarks" / "charts"


def render_file(data_path: Path, svg_path: Path) -> None:
    """Draw the chart in `data_path` (JSON: bars, or a sweep's panels of lines) into `svg_path`."""
    text = data_path.read_text(encoding="utf-8")
    if "panels" in json.loads(text):
        svg = render_line_svg(LineChartData.from_json(text))
    else:
        svg = render_svg(ChartData.from_json(text))
    svg_path.write_text(svg, encoding="utf-8")


def render_all(data_dir: Path = DATA_DIR, chart_dir: Path = CHART_DIR) -> list[Path]:
    """Draw one SVG per JSON file of `data_dir` into `chart_dir`; returns the SVGs' paths, sorted."""
    chart_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for data_path in sorted(data_dir.glob("*.json")):
        svg_path = chart_dir / f"{data_path.stem}.svg"
        render_file(data_path, svg_path)
        written.append(svg_path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, chart=False)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="the charts' JSON data")
    parser.add_argument("--out-dir", type=Path, default=CHART_DIR, help="where the SVGs go")
    args = parser.parse_args(argv)
    for path in render_all(args.data_dir, args.out_dir):
        print(path)


if __name__ == "__main__":
    main()
