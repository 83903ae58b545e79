"""A batch's statuses: which it may move to from each, which are unfinished, and the timestamp each sets."""

from __future__ import annotations

BATCH_TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling"}),
    "in_progress": frozenset({"finalizing", "cancelling", "expired", "failed"}),
    "finalizing": frozenset({"completed", "failed"}),
    "cancelling": frozenset({"cancelled"}),
}
"""The statuses a batch may move to from each status; the others (completed, failed, expired, cancelled) are final."""


ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""Statuses of a batch that is not finished: the server resumes them when it starts."""


TIMESTAMP_OF = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}
