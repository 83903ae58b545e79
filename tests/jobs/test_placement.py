"""Prefix-aware placement: requests that share a prompt prefix share a chunk, on the real driver's code.

`place` over texts, `ChunkCutter` over request lines (the JSONL job's and the Batch API's way),
`TableJob` over a table's rows (parts written in row order whatever order the chunks finish in),
and the table job end to end through flyte's local runner, where placement changes no answer.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import uuid
import weakref
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flyteplugins_batcher.batch_api import ENDPOINTS, parse_request_line
from flyteplugins_batcher.engines import GenerationConfig
from flyteplugins_batcher.jobs import RunOptions, run_table
from flyteplugins_batcher.jobs._table.job import TableJob
from flyteplugins_batcher.jobs._table.options import TableOptions
from flyteplugins_batcher.jobs._table.parts import TableParts
from flyteplugins_batcher.jobs._table.requests import RowRequests
from flyteplugins_batcher.jobs._table.source import TableSource
from flyteplugins_batcher.replica import ChunkCutter, ItemResult, RequestChunk, RequestItem
from flyteplugins_batcher.replica._placement import place
from tests.jobs.conftest import CountingBatcher

SYSTEM = "You answer questions about the document you are given, in one sentence. " * 3


def document(number: int) -> str:
    rng = random.Random(number)
    return f"Document {number}: " + " ".join(rng.choice(["red", "blue", "green", "stone", "river"]) for _ in range(80))


def question_by_question(documents: int, questions: int) -> list[tuple[int, str]]:
    """(document, prompt) listed question by question, as an evaluation file lists them: a document's questions
    lie `documents` lines apart."""
    return [
        (number, f"{SYSTEM}\n{document(number)}\nQuestion {asked}: what is word {asked}?")
        for asked in range(questions)
        for number in range(documents)
    ]


def test_a_documents_questions_share_a_chunk_whatever_order_they_come_in() -> None:
    rows = question_by_question(documents=6, questions=4)

    chunks = place([text for _, text in rows], chunk_size=8)

    assert sorted(position for chunk in chunks for position in chunk) == list(range(len(rows)))
    assert all(len(chunk) <= 8 for chunk in chunks) and len(chunks) == 3
    assert [len({rows[position][0] for position in chunk}) for chunk in chunks] == [2, 2, 2]  # whole documents


def test_with_three_questions_a_document_is_never_split_even_if_chunks_run_short() -> None:
    rows = question_by_question(documents=8, questions=3)

    chunks = place([text for _, text in rows], chunk_size=8)

    holders = {number: {index for index, chunk in enumerate(chunks) if any(rows[p][0] == number for p in chunk)}
               for number in range(8)}  # fmt: skip
    assert all(len(held) == 1 for held in holders.values())
    assert [len(chunk) for chunk in chunks] == [6, 6, 6, 6]  # two documents each: a third would split one


def test_requests_that_share_nothing_fill_whole_chunks() -> None:
    rng = random.Random(7)
    texts = [f"{rng.random()} {rng.random()}" for _ in range(100)]

    chunks = place(texts, chunk_size=8)

    assert len(chunks) == 13 and all(len(chunk) <= 8 for chunk in chunks)  # as few chunks as file order takes


def test_a_group_larger_than_a_chunk_fills_consecutive_chunks() -> None:
    texts = [f"{SYSTEM} shared document {'x' * 500} question {n}" for n in range(20)]
    texts += [f"another {n}" for n in range(3)]

    chunks = place(texts, chunk_size=8)

    holding = [index for index, chunk in enumerate(chunks) if any(position < 20 for position in chunk)]
    assert len(chunks) == 3 and holding == [0, 1, 2]  # the big group in consecutive chunks, none wasted
    assert [index for index, chunk in enumerate(chunks) if {20, 21, 22} <= set(chunk)] == [2]  # the small one whole


def test_placement_is_the_same_for_the_same_input_and_empty_for_none() -> None:
    texts = [text for _, text in question_by_question(documents=5, questions=3)]
    assert place(texts, 4) == place(list(texts), 4)
    assert place([], 8) == []
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        place(texts, 0)


def chat_line(custom_id: str, system: str, text: str) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    body = {"messages": messages}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def cut(cutter: ChunkCutter, rows: list[tuple[int, str]]) -> list[RequestChunk]:
    chunks = []
    for number, (doc, text) in enumerate(rows, start=1):
        line = chat_line(f"d{doc}-{number}", SYSTEM + document(doc), text.rsplit("\n", 1)[1])
        chunks += cutter.add(parse_request_line(line, number, endpoints=ENDPOINTS))
    return [*chunks, *cutter.rest()]  # type: ignore[list-item]


def test_the_cutter_places_request_lines_by_their_messages_and_numbers_chunks_in_order() -> None:
    rows = question_by_question(documents=4, questions=4)

    placed = cut(ChunkCutter(chunk_size=4, embedding_chunk_texts=8), rows)
    in_file_order = cut(ChunkCutter(chunk_size=4, embedding_chunk_texts=8, order="file"), rows)

    documents = [{item.key.split("-")[0] for item in chunk.items} for chunk in placed]
    assert documents == [{"d0"}, {"d1"}, {"d2"}, {"d3"}] and [chunk.index for chunk in placed] == [0, 1, 2, 3]
    assert [len({item.key.split("-")[0] for item in chunk.items}) for chunk in in_file_order] == [4, 4, 4, 4]


def test_the_cutter_groups_only_within_its_window() -> None:
    rows = question_by_question(documents=4, questions=2)  # a document's two questions lie 4 lines apart

    near = cut(ChunkCutter(chunk_size=2, embedding_chunk_texts=8, window=8), rows)
    far = cut(ChunkCutter(chunk_size=2, embedding_chunk_texts=8, window=4), rows)

    assert all(len({item.key.split("-")[0] for item in chunk.items}) == 1 for chunk in near)
    assert all(len({item.key.split("-")[0] for item in chunk.items}) == 2 for chunk in far)


def test_run_options_refuse_an_unknown_order_and_an_empty_window() -> None:
    with pytest.raises(ValueError, match="order must be one of prefix, file, got 'sorted'"):
        RunOptions(order="sorted")
    with pytest.raises(ValueError, match="order_window must be >= 1"):
        RunOptions(order_window=0)


def table_job(tmp_path: Path, table: pa.Table, **kwargs: object) -> TableJob:
    options = TableOptions(prompt="{question}")
    source = TableSource("memory", table.schema, table.num_rows, lambda _rows: iter(table.to_batches(max_chunksize=5)))
    parts = TableParts(tmp_path, options, table.column_names, None)
    return TableJob(source, RowRequests(options, None, GenerationConfig()), parts, **kwargs)  # type: ignore[arg-type]


def test_a_tables_rows_are_placed_by_prefix_and_its_part_comes_back_in_row_order(tmp_path: Path) -> None:
    rows = question_by_question(documents=4, questions=3)
    questions = [text for _, text in rows[:-1]] + [None]  # the last row fails before it is sent
    job = table_job(tmp_path, pa.table({"question": questions}), chunk_size=3, window=64)

    async def run() -> list[RequestChunk]:
        chunks = [chunk async for chunk in job.chunks()]
        for chunk in reversed(chunks):  # chunks finish in any order
            results = [ItemResult(item.key, text=f"answer to {item.key}") for item in chunk.items]
            await job.on_chunk(chunk, type("Outcome", (), {"results": results, "computed_since": lambda *_: True,
                                                           "was_retried": lambda *_: False})(), "")  # fmt: skip
        return chunks  # type: ignore[return-value]

    chunks = asyncio.run(run())

    by_document = [{int(item.messages[0].content.split("Document ")[1].split(":")[0]) for item in chunk.items}
                   for chunk in chunks]  # fmt: skip
    assert all(len(documents) == 1 for documents in by_document) and len(chunks) == 4
    written = pq.read_table(tmp_path / "part-000000000.parquet")
    assert written.column("question").to_pylist() == questions  # one part, the window's rows in their order
    assert written.column("generated_text").to_pylist() == [f"answer to row-{n}" for n in range(11)] + [None]
    assert written.column("error").to_pylist()[-1] == "null_value: column 'question' is null"
    assert (job.counts.done, job.counts.failed) == (12, 1)


def test_the_table_job_holds_no_chunk_after_it_is_answered_nor_a_window_after_it_is_written(tmp_path: Path) -> None:
    rows = question_by_question(documents=8, questions=4)  # 32 rows: 4 windows of 8, chunks of 2
    job = table_job(tmp_path, pa.table({"question": [text for _, text in rows]}), chunk_size=2, window=8)
    answered: list[weakref.ref[RequestItem]] = []

    async def run() -> list[int]:
        alive = []
        async for chunk in job.chunks():  # each chunk answered before the next is asked for, as one slot would
            results = [ItemResult(item.key, text="answer") for item in chunk.items]
            answered.extend(weakref.ref(item) for item in chunk.items)
            await job.on_chunk(chunk, type("Outcome", (), {"results": results, "computed_since": lambda *_: True,
                                                           "was_retried": lambda *_: False})(), "")  # fmt: skip
            del chunk, results
            gc.collect()
            alive.append(sum(reference() is not None for reference in answered))
        return alive

    alive = asyncio.run(run())

    assert alive == [0] * 16  # a request is let go once its chunk is answered, even while its window is handed out
    assert job._parts == {} and job._chunks == {} and len(job.parts.paths) == 4  # every window written and let go


SIMULATED = {
    "engine": "simulated",
    "engine_args": json.dumps({"time_scale": 50, "gpu": {"max_model_len": 512}}),
    "max_new_tokens": 8,
}


def documents_table(tmp_path: Path) -> tuple[pa.Table, str]:
    """Five documents asked three questions each, listed question by question, then a row too long for the context
    and a null one: they fail alone, wherever placement puts them."""
    marker = uuid.uuid4().hex[:8]  # no earlier run asked these (Flyte's cache outlives a test session)
    rows = question_by_question(documents=5, questions=3)
    questions = [f"{text} ({marker})" for _, text in rows] + [f"{marker} " + "word " * 700, None]
    table = pa.table({"question": questions, "n": list(range(len(questions)))})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=4)
    return table, str(tmp_path / "in.parquet")


def test_placement_changes_no_answer_and_keeps_the_tables_order(run_locally, tmp_path: Path) -> None:
    table, path = documents_table(tmp_path)

    outputs = {}
    for order in ("prefix", "file"):
        run_locally(
            run_table, input=path, prompt="{question}", chunk_size=4, order=order, max_failed_fraction=0.5,
            output_dir=str(tmp_path / order), **SIMULATED,
        )  # fmt: skip
        outputs[order] = pq.read_table(tmp_path / order)

    assert outputs["prefix"].column("n").to_pylist() == list(range(table.num_rows))
    assert outputs["prefix"].column("generated_text").equals(outputs["file"].column("generated_text"))
    errors = outputs["prefix"].column("error").to_pylist()
    assert errors[-2].startswith("context_length_exceeded: ") and errors[-1].startswith("null_value: ")
    assert errors[:-2] == [None] * 15 and errors == outputs["file"].column("error").to_pylist()
    assert len(list((tmp_path / "prefix").iterdir())) == 1 and len(list((tmp_path / "file").iterdir())) == 5


def test_a_rerun_reuses_every_chunk_placement_made(cached_run, tmp_path: Path) -> None:
    _, path = documents_table(tmp_path)
    job = {"input": path, "prompt": "{question}", "chunk_size": 4, "max_failed_fraction": 0.5, **SIMULATED}
    first = CountingBatcher()
    cached_run(run_table, first, **job)

    again = CountingBatcher()
    summary = cached_run(run_table, again, **job)

    # The same chunks: every row from the cache; the row that failed in the engine failed for a prompt too long for
    # the model, which fails again with the same model and settings, so it is not tried again either.
    # (A failed row counts as computed by this run, not reused.)
    assert len(first.prompts) == 16 and again.prompts == []
    assert (summary.answered, summary.failed, summary.reused, summary.retried) == (15, 2, 15, 0)


def test_one_group_of_twenty_thousand_lines_fills_whole_chunks_window_after_window() -> None:
    cutter = ChunkCutter(chunk_size=8, embedding_chunk_texts=8, window=8192)
    shared = "Read this contract and answer: " + "clause " * 300
    chunks = []
    for number in range(1, 20_001):
        line = chat_line(f"r{number}", SYSTEM, f"{shared} question {number}")
        chunks += cutter.add(parse_request_line(line, number, endpoints=ENDPOINTS))
    chunks += cutter.rest()

    assert [len(chunk.items) for chunk in chunks] == [8] * 2500  # 8,192 and 3,616 lines: every window divides by 8
    assert sorted(int(item.key[1:]) for chunk in chunks for item in chunk.items) == list(range(1, 20_001))
