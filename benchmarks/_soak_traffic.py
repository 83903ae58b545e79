"""The soak's clients: each picks a kind of request at random (seeded), sends it, and tallies what came back.

Every kind knows the outcomes it may get; anything else is a problem, with what the server said.
The kinds: online chat and text completions (whole, streamed, abandoned halfway through a stream,
abandoned by a client timeout while waiting), embeddings, batches (uploaded, created, some
cancelled, some failing validation on purpose), refused uploads (too large, wrong type, not JSONL),
malformed requests, reads, and deletions of batches' input files.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks._sse import DONE, delta_text, finish_reasons, sse_data

API_KEY = "soak-key"
CHAT, TEXT, EMBED = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
PROMPTS_FILE = Path(__file__).resolve().parent.parent / "flyteplugins_batcher" / "jobs" / "data" / "gsm8k_sample.jsonl"
ANSWER_TOKENS = (16, 48, 96)
"""`max_tokens` of the requests whose answers are compared across kinds (whole and streamed)."""
LONG_TOKENS = 400
"""`max_tokens` of the requests abandoned while they run (the simulated answers run 100 to 300 tokens)."""
WAIT_TIMEOUT_S = 0.2
"""The client timeout of a request abandoned while it waits."""


def prompts() -> list[str]:
    """The questions every client draws from (the bundled gsm8k sample)."""
    with PROMPTS_FILE.open() as lines:
        return [json.loads(line)["question"] for line in lines if line.strip()]


@dataclass
class PlannedBatch:
    """A batch the soak created: what its files must hold at the end."""

    id: str
    input_file_id: str
    endpoint: str
    custom_ids: list[str]
    bad_ids: set[str]
    fails_validation: bool
    cancel_answer: str = ""
    input_deleted: bool = False


@dataclass
class Tally:
    """What every client saw: (kind, outcome) counts, HTTP statuses, problems, batches, answers by request."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    batches: list[PlannedBatch] = field(default_factory=list)
    answers: dict[tuple[str, int, int], str] = field(default_factory=dict)

    def answered(self, key: tuple[str, int, int], text: str, kind: str) -> str:
        """Keep an answer's text; the outcome is `ok`, or `differs` when the same request got another text before."""
        known = self.answers.setdefault(key, text)
        if known == text:
            return "ok"
        self.problems.append(f"{kind}: {key} answered {text[:60]!r}, before {known[:60]!r}")
        return "differs from an earlier answer"

    def unexpected(self, kind: str, response: httpx.Response, wanted: str) -> str:
        """Record a response that is not what `kind` expects; the outcome names its status."""
        try:
            body = response.text[:200]
        except httpx.ResponseNotRead:
            body = "(not read)"
        self.problems.append(f"{kind}: wanted {wanted}, got {response.status_code}: {body}")
        return f"UNEXPECTED {response.status_code}"


@dataclass
class Client:
    """One client: its HTTP connection, its seeded choices, the shared tally."""

    http: httpx.AsyncClient
    rng: random.Random
    tally: Tally
    name: str
    questions: list[str]
    embeddings: bool
    serial: int = 0

    def unique(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.name}-{self.serial}"

    def question(self) -> tuple[int, str]:
        index = self.rng.randrange(len(self.questions))
        return index, self.questions[index]


def generation_body(endpoint: str, question: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A chat or text completion request body, greedy."""
    if endpoint == CHAT:
        return {
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0,
            **extra,
        }
    return {"prompt": question, "max_tokens": max_tokens, "temperature": 0, **extra}


async def whole_answer(client: Client, endpoint: str) -> str:
    """A chat or text completion, not streamed: 200, a well-formed answer, the same as before for the same request."""
    kind = "chat" if endpoint == CHAT else "completion"
    index, question = client.question()
    max_tokens = client.rng.choice(ANSWER_TOKENS)
    response = await client.http.post(endpoint, json=generation_body(endpoint, question, max_tokens))
    if response.status_code != 200:
        return client.tally.unexpected(kind, response, "200")
    body = response.json()
    choice = body["choices"][0]
    text = choice["message"]["content"] if endpoint == CHAT else choice["text"]
    if body["usage"]["completion_tokens"] > max_tokens or choice["finish_reason"] not in ("stop", "length"):
        client.tally.problems.append(f"{kind}: a malformed answer {body}")
        return "malformed answer"
    return client.tally.answered((endpoint, index, max_tokens), text, kind)


async def streamed_answer(client: Client, endpoint: str) -> str:
    """A streamed chat or text completion read to `[DONE]`: its text is the whole answer's."""
    kind = "chat, streamed" if endpoint == CHAT else "completion, streamed"
    index, question = client.question()
    max_tokens = client.rng.choice(ANSWER_TOKENS)
    usage = client.rng.random() < 0.5
    body = generation_body(endpoint, question, max_tokens, stream=True, stream_options={"include_usage": usage})
    async with client.http.stream("POST", endpoint, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return client.tally.unexpected(kind, response, "200")
        events = [event async for event in sse_data(response)]
    finished = [reason for event in events if event != DONE for reason in finish_reasons(event)]
    usage_events = [event for event in events if event != DONE and event.get("usage")]
    if not events or events[-1] != DONE or len(finished) != 1 or len(usage_events) != int(usage):
        client.tally.problems.append(f"{kind}: a malformed stream of {len(events)} events ({finished}, usage {usage})")
        return "malformed stream"
    text = "".join(delta_text(event) for event in events if event != DONE)
    return client.tally.answered((endpoint, index, max_tokens), text, kind)


async def stream_abandoned(client: Client) -> str:
    """A long streamed answer whose client closes the connection after its first content events."""
    endpoint = client.rng.choice((CHAT, CHAT, TEXT))
    body = generation_body(endpoint, client.question()[1], LONG_TOKENS, stream=True)
    keep = client.rng.randint(1, 3)
    async with client.http.stream("POST", endpoint, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return client.tally.unexpected("stream abandoned", response, "200")
        read = 0
        async for event in sse_data(response):
            if event == DONE:
                return "ended before the client left"
            read += bool(delta_text(event))
            if read >= keep:
                break
    return "left after the first events"


async def wait_abandoned(client: Client) -> str:
    """A long answer, not streamed, whose client gives up waiting after `WAIT_TIMEOUT_S`."""
    endpoint = client.rng.choice((CHAT, TEXT))
    body = generation_body(endpoint, client.question()[1], LONG_TOKENS)
    try:
        response = await client.http.post(endpoint, json=body, timeout=httpx.Timeout(30.0, read=WAIT_TIMEOUT_S))
    except httpx.ReadTimeout:
        return "left while waiting (client timeout)"
    if response.status_code != 200:
        return client.tally.unexpected("wait abandoned", response, "200 or a timeout")
    return "answered before the timeout"


async def embeddings(client: Client) -> str:
    """One to four texts embedded: one vector each, all of one size."""
    texts = [client.question()[1] for _ in range(client.rng.randint(1, 4))]
    response = await client.http.post(EMBED, json={"input": texts})
    if response.status_code != 200:
        return client.tally.unexpected("embeddings", response, "200")
    vectors = [item["embedding"] for item in response.json()["data"]]
    if len(vectors) != len(texts) or len({len(vector) for vector in vectors}) != 1:
        client.tally.problems.append(f"embeddings: {len(vectors)} vectors for {len(texts)} texts")
        return "malformed answer"
    return "ok"


async def reads(client: Client) -> str:
    """The read-only endpoints: lists, models, health, one batch."""
    paths = ["/v1/batches?limit=5", "/v1/files?limit=5", "/v1/models", "/health"]
    if client.tally.batches:
        paths.append(f"/v1/batches/{client.rng.choice(client.tally.batches).id}")
    path = client.rng.choice(paths)
    response = await client.http.get(path)
    return "ok" if response.status_code == 200 else client.tally.unexpected(f"read {path}", response, "200")


async def delete_input(client: Client) -> str:
    """Delete a batch's input file: done once the batch has ended, refused (400) while it runs."""
    candidates = [batch for batch in client.tally.batches if not batch.input_deleted]
    if not candidates:
        return "nothing to delete yet"
    batch = client.rng.choice(candidates)
    batch.input_deleted = True  # claimed: no other client deletes it meanwhile
    response = await client.http.delete(f"/v1/files/{batch.input_file_id}")
    if response.status_code == 200:
        return "deleted"
    batch.input_deleted = False
    if response.status_code == 400 and "has not finished" in response.text:
        return "refused: its batch runs"
    return client.tally.unexpected("delete input", response, "200, or 400 while its batch runs")


Action = Callable[[Client], Awaitable[str]]


async def run_client(client: Client, kinds: dict[str, tuple[float, Action]], until: float) -> None:
    """Send requests of random kinds, one at a time, until the monotonic clock passes `until`."""
    names = list(kinds)
    weights = [kinds[name][0] for name in names]
    while time.monotonic() < until:
        kind = client.rng.choices(names, weights)[0]
        try:
            outcome = await kinds[kind][1](client)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            client.tally.problems.append(f"{kind}: {type(error).__name__}: {error}")
            outcome = f"ERROR {type(error).__name__}"
        client.tally.outcomes[kind, outcome] += 1
