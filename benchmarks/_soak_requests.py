"""The soak's Batch API traffic, and the requests the server must refuse: refused uploads, malformed requests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from benchmarks._soak_traffic import CHAT, EMBED, TEXT, Client, PlannedBatch, generation_body

MAX_UPLOAD_MB = 1
"""The server's upload limit in the soak (`--max-upload-mb`): a refused upload is just over it."""
MAX_REQUEST_MB = 1
"""The server's limit on every other body in the soak (`--max-request-mb`)."""
CANCEL_SHARE = 0.35
"""The share of batches their client cancels (at once, or after up to 0.8 s)."""
FAILING_SHARE = 0.06
"""The share of batches with a line for another endpoint: they fail validation."""
BAD_LINE_SHARE = 0.1
"""The share of lines whose body is invalid: each must fail alone, in its batch's error file."""


def batch_line(client: Client, custom_id: str, endpoint: str, *, bad: bool) -> dict[str, Any]:
    """One request line of a batch for `endpoint`; a `bad` one has a body the server must refuse."""
    question = client.question()[1]
    if endpoint == EMBED:
        body: dict[str, Any] = {"input": {"not": "text"}} if bad else {"input": question}
    elif bad:
        body = (
            {"messages": "not a list", "max_tokens": 8} if endpoint == CHAT else {"prompt": question, "max_tokens": -3}
        )
    else:
        body = generation_body(endpoint, question, client.rng.choice((8, 32, 64)))
    return {"custom_id": custom_id, "method": "POST", "url": endpoint, "body": body}


def plan_lines(client: Client) -> tuple[str, list[dict[str, Any]], set[str], bool]:
    """A batch's endpoint, its lines, the custom ids of its bad lines, and whether it fails validation."""
    endpoints = [CHAT, CHAT, CHAT, TEXT, *([EMBED] if client.embeddings else [])]
    endpoint = client.rng.choice(endpoints)
    tag = client.unique("b")
    lines, bad_ids = [], set()
    for number in range(client.rng.randint(4, 32)):
        bad = client.rng.random() < BAD_LINE_SHARE
        lines.append(batch_line(client, f"{tag}-{number}", endpoint, bad=bad))
        if bad:
            bad_ids.add(lines[-1]["custom_id"])
    failing = client.rng.random() < FAILING_SHARE
    if failing:
        lines[-1]["url"] = TEXT if endpoint == CHAT else CHAT
    return endpoint, lines, bad_ids, failing


async def upload(
    client: Client, content: bytes, *, purpose: str = "batch", name: str = "batch.jsonl"
) -> httpx.Response:
    files = {"file": (name, content, "application/jsonl")}
    return await client.http.post("/v1/files", files=files, data={"purpose": purpose})


async def batch(client: Client) -> str:
    """Upload a batch file and create a batch over it; cancel some of them, at once or a little later."""
    endpoint, lines, bad_ids, failing = plan_lines(client)
    uploaded = await upload(client, "".join(json.dumps(line) + "\n" for line in lines).encode())
    if uploaded.status_code != 200:
        return client.tally.unexpected("batch upload", uploaded, "200")
    file_id = uploaded.json()["id"]
    body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h", "metadata": {"by": client.name}}
    created = await client.http.post("/v1/batches", json=body)
    if created.status_code != 200:
        return client.tally.unexpected("batch create", created, "200")
    custom_ids = [line["custom_id"] for line in lines]
    planned = PlannedBatch(created.json()["id"], file_id, endpoint, custom_ids, bad_ids, failing)
    client.tally.batches.append(planned)
    if client.rng.random() < CANCEL_SHARE:
        client.tally.outcomes["batch cancel", await cancel(client, planned)] += 1
    return "created, to fail validation" if failing else "created"


async def cancel(client: Client, planned: PlannedBatch) -> str:
    """Cancel a batch at once or after up to 0.8 s: `cancelling` while it runs, 400 once it has ended."""
    if client.rng.random() < 0.6:
        await asyncio.sleep(client.rng.uniform(0.05, 0.8))
    response = await client.http.post(f"/v1/batches/{planned.id}/cancel")
    if response.status_code == 200 and response.json()["status"] in ("cancelling", "cancelled"):
        planned.cancel_answer = response.json()["status"]
        return "cancelling"
    if response.status_code == 400 and response.json()["error"]["code"] == "batch_not_cancellable":
        return "refused: it had ended"
    return client.tally.unexpected("batch cancel", response, "200 cancelling, or 400 batch_not_cancellable")


async def refused_upload(client: Client) -> str:
    """An upload the server must refuse: too large (413), not multipart (415), not JSONL or not for batches (400)."""
    line = json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": {"messages": []}}) + "\n"
    way = client.rng.choice(("too large", "not multipart", "not JSONL", "wrong purpose"))
    if way == "too large":
        content = line.encode() * (MAX_UPLOAD_MB * 2**20 // len(line) + 64)
        try:
            response = await upload(client, content)
        except httpx.TransportError:  # the server may close before it is all sent
            return "too large: closed while sending"
        wanted = 413
    elif way == "not multipart":
        response = await client.http.post(
            "/v1/files", content=line.encode(), headers={"Content-Type": "application/json"}
        )
        wanted = 415
    else:
        content, purpose = (b"a,b\n1,2\n", "batch") if way == "not JSONL" else (line.encode(), "fine-tune")
        response = await upload(client, content, purpose=purpose, name="data.csv")
        wanted = 400
    if response.status_code != wanted:
        return client.tally.unexpected(f"upload {way}", response, str(wanted))
    return f"{way}: {wanted}"


def _malformed_requests(client: Client) -> list[tuple[str, int, dict[str, Any]]]:
    """(name, wanted status, `httpx.AsyncClient.request` arguments) for each malformed request."""
    chat = generation_body(CHAT, "Hello?", 8)
    json_type, text_type = {"Content-Type": "application/json"}, {"Content-Type": "text/plain"}
    minutes = {"input_file_id": "file-x", "endpoint": CHAT, "completion_window": "30m"}
    unknown = {"input_file_id": "file-nope", "endpoint": CHAT, "completion_window": "24h"}
    too_large = b" " * (MAX_REQUEST_MB * 2**20 + 1)
    return [
        ("not JSON", 400, {"url": CHAT, "content": b'{"messages": [', "headers": json_type}),
        ("JSON, not an object", 400, {"url": CHAT, "json": [chat]}),
        ("text/plain body", 415, {"url": CHAT, "content": json.dumps(chat).encode(), "headers": text_type}),
        ("no messages", 400, {"url": CHAT, "json": {"max_tokens": 8}}),
        ("messages not a list", 400, {"url": CHAT, "json": {**chat, "messages": "hi"}}),
        ("negative max_tokens", 400, {"url": TEXT, "json": {"prompt": "hi", "max_tokens": -1}}),
        ("unknown model", 404, {"url": CHAT, "json": {**chat, "model": "no-such-model"}}),
        ("empty Authorization", 401, {"url": CHAT, "json": chat, "headers": {"Authorization": ""}}),
        ("wrong API key", 401, {"url": CHAT, "json": chat, "headers": {"Authorization": "Bearer wrong"}}),
        ("Basic auth", 401, {"url": CHAT, "json": chat, "headers": {"Authorization": "Basic c29hazprZXk="}}),
        ("foreign Host", 400, {"url": CHAT, "json": chat, "headers": {"Host": "evil.example"}}),
        ("foreign Origin", 403, {"url": CHAT, "json": chat, "headers": {"Origin": "https://evil.example"}}),
        ("body over the limit", 413, {"url": CHAT, "content": too_large, "headers": json_type}),
        ("minutes window", 400, {"url": "/v1/batches", "json": minutes}),
        ("unknown input file", 404, {"url": "/v1/batches", "json": unknown}),
        ("unknown batch", 404, {"method": "GET", "url": "/v1/batches/batch_nope"}),
        ("unknown file", 404, {"method": "GET", "url": "/v1/files/file-nope/content"}),
    ]  # fmt: skip


async def malformed(client: Client) -> str:
    """A request the server must refuse with a 4xx that names why."""
    name, wanted, arguments = client.rng.choice(_malformed_requests(client))
    arguments = {"method": "POST", **arguments}
    try:
        response = await client.http.request(**arguments)
    except httpx.TransportError as error:  # a body over the limit: the server may close before it is all sent
        if wanted == 413:
            return "413: closed while sending"
        client.tally.problems.append(f"{name}: wanted {wanted}, the connection failed: {error!r}")
        return f"ERROR {type(error).__name__}"
    if response.status_code != wanted or "error" not in response.json():
        return client.tally.unexpected(name, response, f"{wanted} with an error object")
    return str(wanted)
