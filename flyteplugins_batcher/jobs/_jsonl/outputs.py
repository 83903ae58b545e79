"""Where a JSONL run's finished lines go: `results.jsonl` and `errors.jsonl`, or `vllm run-batch`'s one file.

- `SplitOutputs` (`-o DIR`, `--output_dir`): answered lines in `results.jsonl`, failed ones in
  `errors.jsonl`, each written as its chunk finishes.
- `OrderedOutput` (`-o FILE.jsonl`, `--output_file`): every line's result or error line in one file, in
  input order, as `vllm run-batch -o` writes it (kept by line number until the run ends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from flyteplugins_batcher.jobs._outputs import InputOrderFile, JsonLines
from flyteplugins_batcher.replica import FinishedLine

SPLIT_FILES = ("results.jsonl", "errors.jsonl")
"""The files `SplitOutputs` writes."""


class LineOutputs(Protocol):
    """What a JSONL run writes its finished lines to."""

    def write(self, finished: FinishedLine) -> None:
        """Keep one finished line's output."""

    def close(self) -> None:
        """Finish the files (once every line is written)."""

    def files(self) -> tuple[Path, Path | None]:
        """The results file, and the errors file (`None`: the errors are in the results file)."""


class SplitOutputs:
    """Answered lines in `results.jsonl`, failed ones in `errors.jsonl`, written as they finish.

    Args:
        folder: Where both files go.

    Example:
        ```python
        outputs = SplitOutputs(work)
        outputs.write(FinishedLine.failed(error))  # a line of errors.jsonl
        ```
    """

    def __init__(self, folder: Path) -> None:
        results, errors = SPLIT_FILES
        self.results = JsonLines(folder / results)
        self.errors = JsonLines(folder / errors)

    def write(self, finished: FinishedLine) -> None:
        (self.results if finished.ok else self.errors).write(finished.output)

    def close(self) -> None:
        self.results.close()
        self.errors.close()

    def files(self) -> tuple[Path, Path | None]:
        return self.results.path, self.errors.path


class OrderedOutput:
    """Every line's result or error line in one file, in input order (`vllm run-batch -o FILE`'s output file).

    Args:
        path: The file (written when the run closes it).

    Example:
        ```python
        outputs = OrderedOutput(work / "out.jsonl")
        ```
    """

    def __init__(self, path: Path) -> None:
        self.file = InputOrderFile(path)

    def write(self, finished: FinishedLine) -> None:
        self.file.add(finished.line, finished.output)

    def close(self) -> None:
        self.file.close()

    def files(self) -> tuple[Path, Path | None]:
        return self.file.path, None
