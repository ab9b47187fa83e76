"""Grants (SPEC §7, §17 "Grants and `ask` rules"): what an approval with **Always allow** or **Allow in this
thread** records, and how one is told.

A grant covers one exact call (agent, tool, canonical arguments) at one place, or in one thread of it. A call
that no rule decides is granted for good; under a ``[[policies]]`` rule with ``grant_ttl_s`` (and quorum 1) a
grant lasts that long and is bound to that very rule (``rule_key``): a call is looked up under the rule that
decides it now, so a grant made under one rule never covers a call another (or an edited) rule asks about.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class GrantScope(enum.StrEnum):
    PLACE = "place"  # Always allow: the channel (place) the call was asked in
    THREAD = "thread"  # Allow in this thread: that conversation only (its sub-agents' sessions included)


# A click's verdict and the grant it records.
GRANT_VERDICTS = {"always": GrantScope.PLACE, "thread": GrantScope.THREAD}


@dataclass(frozen=True)
class GrantTerms:
    """What an approval that grants records besides the decision: the exact call, where and until when it
    holds, and the rule it was made under (None: a call no rule decides)."""

    call: str  # core.approvals.grant_call
    scope: GrantScope
    thread: str | None  # the conversation (core.model.thread_of) for THREAD; None for PLACE
    expires_at: datetime | None  # None: never
    rule: str | None = None  # Policy.describe(), for people reading the grant
    rule_key: str | None = None  # the rule's fingerprint (core.approvals.rule_key): what lookups match


def lasting(seconds: float) -> str:
    """A grant's lifetime as a person says it: "90 seconds", "30 minutes", "2 hours", "3 days"."""
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if (seconds >= size and seconds % size == 0) or seconds >= 2 * size:
            count = round(seconds / size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    count = round(seconds)
    return f"{count} second{'' if count == 1 else 's'}"


def granted_label(scope: str | None, ttl_s: float | None) -> str:
    """How a settled card says an approval that granted: "Always allowed", "Allowed in this thread for 1 hour"."""
    if scope == GrantScope.THREAD:
        label = "Allowed in this thread"
    else:
        label = "Always allowed" if ttl_s is None else "Allowed here"
    return f"{label} for {lasting(ttl_s)}" if ttl_s is not None else label
