"""On-call approvers (SPEC §17): an ``approvers`` / ``escalate_to`` entry ``oncall:<schedule id>`` names whoever is
on call in that rota when a request is made. Core only knows the shape of such an entry and asks an ``OnCallRota``
(the wiring's: PagerDuty, with each channel's people looked up by e-mail) who they are; the request is then written
with the people themselves, so its decision, a restart or another replica use who was on call when it was asked.

A rota that cannot be read never widens who may decide: its entry is dropped (the rule's ``escalate_to`` join at
once, ``ApprovalBroker``), and a request left with nobody is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

ONCALL = "oncall"  # the prefix of an on-call entry: no channel may take this name (bot.channels)
SCHEDULE_ID = re.compile(r"[A-Z0-9]{1,20}")  # PagerDuty's ids (e.g. P1AB2CD): nothing that could be a path
MAX_ON_CALL = 50  # people one schedule may have on call at once; a longer answer is refused, not cut


class RotaUnavailable(Exception):
    """The rota could not say who is on call (unreachable, refused, nobody on call, nobody matched). Its text
    is shown in the thread and told to the model: it names no secret and quotes nothing the rota sent."""


class OnCallRota(Protocol):
    async def people(self, schedule: str) -> frozenset[str]:
        """Who is on call now in ``schedule``, as people core compares (``<channel>:<id>``); never empty:
        raises RotaUnavailable instead."""
        ...


@runtime_checkable
class EmailDirectory(Protocol):
    """A channel that can find one of its people by e-mail address (Slack: ``users.lookupByEmail``)."""

    @property
    def name(self) -> str: ...

    async def person_by_email(self, email: str) -> str | None:
        """The channel's id of the active, full member with this address; None when there is none (or not now)."""
        ...


def schedule_of(entry: str) -> str | None:
    """The schedule id an ``oncall:<id>`` entry names; None for any other entry (or a malformed one)."""
    prefix, colon, schedule = entry.partition(":")
    if prefix != ONCALL or not colon or SCHEDULE_ID.fullmatch(schedule) is None:
        return None
    return schedule


def is_oncall(entry: str) -> bool:
    """Whether ``entry`` is an on-call entry (well formed or not: a malformed one still names nobody)."""
    return entry.partition(":")[0] == ONCALL and ":" in entry


def names_oncall(entries: Iterable[str]) -> bool:
    return any(is_oncall(entry) for entry in entries)


@dataclass(frozen=True)
class OnCall:
    """Configured entries with every on-call entry replaced by the people on call (order kept, no repeats), and
    the schedules that could not be read, each with why."""

    entries: tuple[str, ...]
    unavailable: tuple[tuple[str, str], ...] = ()

    def said(self) -> str:
        return "; ".join(f"PagerDuty schedule {schedule}: {why}" for schedule, why in self.unavailable)


async def on_call(entries: Iterable[str], rota: OnCallRota | None) -> OnCall:
    """``entries`` with their on-call people. Without a rota (PAGERDUTY_TOKEN unset: start-up refuses that
    configuration) every on-call entry is unavailable."""
    found: list[str] = []
    unavailable: list[tuple[str, str]] = []
    for entry in entries:
        if not is_oncall(entry):
            found.append(entry)
            continue
        schedule = schedule_of(entry)
        if schedule is None:
            unavailable.append((entry.partition(":")[2][:40], "not a schedule id"))
        elif rota is None:
            unavailable.append((schedule, "no rota is configured (PAGERDUTY_TOKEN)"))
        else:
            try:
                found.extend(sorted(await rota.people(schedule)))
            except RotaUnavailable as exc:
                unavailable.append((schedule, str(exc)))
    return OnCall(tuple(dict.fromkeys(found)), tuple(unavailable))
