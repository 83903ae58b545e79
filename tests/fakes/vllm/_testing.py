"""Fake-only hooks: what the fake vLLM was asked to do, and knobs that shape its behaviour.

A test reads `RECORDER` after driving the engine. The fixture that puts the fake on `sys.path`
re-imports it for every test, so each test starts with a fresh recorder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerateCall:
    """One `LLM.generate` call, as received."""

    prompts: Any
    sampling_params: Any
    use_tqdm: Any


@dataclass
class RequestTrace:
    """One `AsyncLLM.generate` request and when it ran."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: Any
    started: float
    finished: float | None = None

    @property
    def reserved_tokens(self) -> int:
        """Prompt tokens + `max_tokens`: the most KV-cache slots the request can take."""
        return len(self.prompt_token_ids) + (self.sampling_params.max_tokens or 0)


@dataclass
class Recorder:
    """Calls seen by the fake, plus the knobs tests turn.

    Attributes:
        step_s: Simulated seconds per decode step in `AsyncLLM` (continuous batching: a step
            advances every running request by one token, however many are running).
        fail_marker: `AsyncLLM.generate` fails a request whose prompt text contains it.
    """

    step_s: float = 0.0
    fail_marker: str | None = None
    llm_inits: list[dict[str, Any]] = field(default_factory=list)
    generate_calls: list[GenerateCall] = field(default_factory=list)
    engine_args: list[Any] = field(default_factory=list)
    requests: list[RequestTrace] = field(default_factory=list)
    active: dict[str, RequestTrace] = field(default_factory=dict)
    max_active_requests: int = 0
    max_active_tokens: int = 0
    shutdowns: int = 0

    def start(self, request_id: str, prompt_token_ids: list[int], sampling_params: Any) -> RequestTrace:
        if request_id in self.active:
            # vLLM < 0.11 rejected a running request id; newer ones suffix it. Reject, to catch reuse.
            raise ValueError(f"Request id {request_id} already running.")
        trace = RequestTrace(request_id, list(prompt_token_ids), sampling_params, started=time.perf_counter())
        self.requests.append(trace)
        self.active[request_id] = trace
        self.max_active_requests = max(self.max_active_requests, len(self.active))
        self.max_active_tokens = max(self.max_active_tokens, sum(t.reserved_tokens for t in self.active.values()))
        return trace

    def finish(self, trace: RequestTrace) -> None:
        trace.finished = time.perf_counter()
        self.active.pop(trace.request_id, None)


RECORDER = Recorder()
