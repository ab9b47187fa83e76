"""Separation of duties (SPEC §17 ``self_approval``): with it off, nobody whose words the turn took may approve
what it asks for, admins included; quorum counts only the others.

The senders are everyone the turn's words came from when the call was asked (the requester, anyone steered or
merged in, and earlier askers whose words the model read): the call may be any of their ideas. They are stored
on the request, so a decision after a restart, on any replica, is judged alike. A sender may still deny (a
requester may always withdraw their own request); approving, "Always allow" and a quorum vote are refused. An
operator's decision from the CLI is exempt, and audited as such.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.model import EVENT_PREFIX, ApprovalInfo
from core.people import REQUESTER
from core.policies import Policy, PolicyAction

REFUSED = ("You asked for this; it needs someone other than you: self-approval is off here. You may still deny it, "
           "and nothing else changes.")
OPERATOR_EXEMPT = {"self_approval_exempt": "operator"}  # the audit detail of an operator's decision


def effective(policy: Policy | None, default: bool) -> bool:
    """Whether a sender may approve a request ``policy`` asks (None: a call no rule decides)."""
    if policy is not None and policy.self_approval is not None:
        return policy.self_approval
    return default


def barred(request: ApprovalInfo, user: str) -> bool:
    """Whether ``user`` (a person of the request's channel: ``Gateway.decide`` refuses other channels') may not
    approve ``request`` because their words are part of the turn that asked."""
    if request.self_approval:
        return False
    return user in request.senders or (request.requester is not None and user == request.requester)


def needs_other(request: ApprovalInfo, mention: Callable[[str], str] = str, *, limit: int = 10) -> str | None:
    """"needs someone other than @a and @b" for a card while self-approval is off; None otherwise. ``mention``
    renders one user id (a channel's mention)."""
    if request.self_approval:
        return None
    # An event source is no person who could click (core.model.EVENT_PREFIX): not named.
    people = list(dict.fromkeys(s for s in (request.requester, *request.senders)
                                if s and not s.startswith(EVENT_PREFIX)))
    if not people:
        return None
    named = [mention(p) for p in people[:limit]]
    if len(people) > limit:
        named.append(f"{len(people) - limit} more")
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    return f"needs someone other than {listed}"


@dataclass(frozen=True)
class Deciders:
    """Who may decide the calls one agent asks for with no rule's approvers: its own, else BOT_APPROVERS."""

    agent: str
    approvers: tuple[str, ...]


def unsatisfiable(policies: Sequence[Policy], agents: Sequence[Deciders], *, admins: tuple[str, ...],
                  default: bool) -> list[str]:
    """One line per setup nobody could ever approve: self-approval refused, no admin (they may decide anything),
    and the approvers (with those who join at a reminder) name nobody but ``requester``. ``default``:
    BOT_SELF_APPROVAL, which also covers calls no rule decides."""
    if admins:
        return []
    lines = []
    fix = "name other approvers, set BOT_ADMINS, or allow self-approval"
    if not default:
        for deciders in agents:
            if _only_requester(deciders.approvers):
                lines.append(f"BOT_SELF_APPROVAL=false, and only the requester may approve agent "
                             f"{deciders.agent!r}'s gated calls: nobody could ever approve them ({fix})")
    for policy in policies:
        if policy.action is not PolicyAction.ASK or effective(policy, default):
            continue
        if policy.approvers:
            stuck = [] if not _only_requester((*policy.approvers, *policy.escalate_to)) else [""]
        else:
            stuck = [d.agent for d in agents if _only_requester((*d.approvers, *policy.escalate_to))]
        for agent in stuck:
            whose = f" (for agent {agent!r})" if agent else ""
            lines.append(f"{policy.describe()} refuses self-approval, and only the requester may approve it{whose}: "
                         f"nobody could ever approve it ({fix})")
    return lines


def tight_quorums(policies: Sequence[Policy], *, default: bool) -> list[str]:
    """One line per rule refusing self-approval whose quorum needs every approver it names (no user group): a
    request one of them asks for is reached only with admins' votes. Said, not refused (others may ask)."""
    lines = []
    for policy in policies:
        if policy.action is not PolicyAction.ASK or effective(policy, default) or policy.quorum <= 1:
            continue
        named = [a for a in policy.approvers if a != REQUESTER]
        if named and not any(a.rpartition(":")[2].startswith("S") for a in named) and policy.quorum >= len(named):
            lines.append(f"{policy.describe()} needs {policy.quorum} of its {len(named)} named approvers and refuses "
                         "self-approval: a call one of them asks for is approved only with an admin's vote")
    return lines


def _only_requester(approvers: tuple[str, ...]) -> bool:
    return all(entry == REQUESTER for entry in approvers)
