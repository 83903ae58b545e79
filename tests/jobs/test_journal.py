"""The run journal: a run's finished lines in whole, numbered segments, read back in order (`jobs/_journal.py`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from flyte.io import File

from flyteplugins_batcher.jobs import read_journal_segment, run_batch_file
from flyteplugins_batcher.jobs._journal import JournalWriter, segment_name
from flyteplugins_batcher.replica import FinishedLine


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def entry(line: int, ok: bool = True) -> FinishedLine:
    return FinishedLine(line, ok, {"custom_id": f"r{line}", "ok": ok}, input_tokens=line, output_tokens=2 * line)


def test_segments_are_written_at_most_every_interval_and_the_rest_at_close(tmp_path: Path) -> None:
    clock = Clock()
    journal = JournalWriter(str(tmp_path / "journal"), interval_s=2.0, clock=clock)

    async def scenario() -> list[list[FinishedLine] | None]:
        journal.add(entry(1))
        await journal.flush()  # too soon: kept
        clock.now = 2.5
        journal.add(entry(3, ok=False))
        await journal.flush()  # a segment of both
        journal.add(entry(2))
        clock.now = 3.0
        await journal.flush()  # too soon again
        await journal.flush(force=False)
        await journal.close()  # the rest, whatever the clock
        await journal.close()  # nothing left: no empty segment
        return [await read_journal_segment(str(tmp_path / "journal"), number) for number in (1, 2, 3)]

    first, second, third = asyncio.run(scenario())
    assert first == [entry(1), entry(3, ok=False)]
    assert second == [entry(2)]
    assert third is None and journal.segments == 2
    assert sorted(path.name for path in (tmp_path / "journal").iterdir()) == [segment_name(1), segment_name(2)]


def test_an_entry_round_trips_with_its_tokens_and_unicode() -> None:
    original = FinishedLine(7, True, {"custom_id": "ü-7", "text": "naïve — ok"}, input_tokens=11, output_tokens=5)
    assert FinishedLine.from_json(original.to_json()) == original


def test_a_file_uri_is_a_local_folder(tmp_path: Path) -> None:
    async def scenario() -> list[FinishedLine] | None:
        journal = JournalWriter(f"file://{tmp_path}/j")
        journal.add(entry(4))
        await journal.close()
        return await read_journal_segment(f"file://{tmp_path}/j", 1)

    assert asyncio.run(scenario()) == [entry(4)]
    assert not [path for path in (tmp_path / "j").iterdir() if path.name.startswith(".")]  # no temporary left


def chat(custom_id: str, text: str) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_the_jsonl_job_journals_every_line_it_writes_with_its_line_number(run_locally, tmp_path: Path) -> None:
    lines = [json.dumps(chat(f"q{number}", f"question {number}")) for number in range(1, 21)]
    lines[4] = "{not json"  # line 5 fails alone
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")

    summary = run_locally(
        run_batch_file,
        input=File.from_local_sync(str(tmp_path / "in.jsonl")),
        output_dir=str(tmp_path / "out"),
        journal=str(tmp_path / "journal"),
        chunk_size=3,
        max_failed_fraction=1.0,
        engine="simulated",
        model_mismatch="ignore",
    )

    entries: list[FinishedLine] = []
    number = 1
    while (segment := asyncio.run(read_journal_segment(str(tmp_path / "journal"), number))) is not None:
        entries += segment
        number += 1
    assert sorted(item.line for item in entries) == list(range(1, 21))  # each line once
    by_line = {item.line: item for item in entries}
    assert not by_line[5].ok and by_line[5].output["error"]["code"] == "invalid_json"
    results = {
        json.loads(text)["custom_id"]: json.loads(text) for text in Path(summary.results.path).read_text().splitlines()
    }
    assert len(results) == 19 == sum(item.ok for item in entries)
    for item in entries:
        if item.ok:  # the journal's line is the result line, and its number is the request's
            assert results[item.output["custom_id"]] == item.output
            assert item.output["custom_id"] == f"q{item.line}" and item.output_tokens > 0
