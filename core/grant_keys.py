"""What a grant is keyed by and what it may cover (SPEC §7 "Always allow", §17 grants): the exact call, the rule it
was made under, and which rules offer grants at all. The broker (``core.approvals``) looks grants up by these."""

from __future__ import annotations

import hashlib
from typing import Any

from core.policies import Policy
from core.store.tables import GrantRow
from core.tools import DESTINATION_TOOL, canonical_call
from core.views import GrantView


def grant_call(tool: str, args: dict[str, Any]) -> str | None:
    """What an "Always allow" of this call is keyed by: every argument, exactly (compact sorted
    JSON), so another command, timeout or credential list is another call. A destination approval
    is keyed by the destination's id and the schedule's creator, not by the schedule or its prompt.
    None: it cannot be granted."""
    if tool == DESTINATION_TOOL:
        destination, creator = args.get("destination_id"), args.get("creator")
        if not (isinstance(destination, str) and destination and isinstance(creator, str) and creator):
            return None
        return canonical_call({"creator": creator, "destination": destination})
    return canonical_call(args)


def grant_view(grant: GrantRow) -> GrantView:
    assert grant.id is not None
    return GrantView(id=grant.id, agent=grant.agent, tool=grant.tool, place=grant.place, created_by=grant.created_by,
                     created_at=grant.created_at, call_text=grant.call_text, thread=grant.thread,
                     expires_at=grant.expires_at, revoked_by=grant.revoked_by, revoked_at=grant.revoked_at,
                     rule=grant.rule)


def grants_cover(policy: Policy | None) -> bool:
    """Whether grants may cover a call this rule decides (None: a call no rule decides, always). A rule offers
    grants only with grant_ttl_s and quorum 1: a grant stands for one person's decision, never for a quorum; and
    never with step_up: a grant would let later calls run with no passkey at all."""
    return policy is None or (policy.grant_ttl_s is not None and policy.quorum <= 1 and not policy.step_up)


def rule_key(policy: Policy) -> str:
    """The rule's fingerprint: every field of it (what it matches, who approves, how many, how long a grant
    lasts, its place in the file). A grant is bound to it, so a grant never covers a call that another rule
    decides, nor one the same rule decides once it has been edited (stricter approvers, a shorter grant_ttl_s)."""
    return hashlib.sha256(repr(policy).encode()).hexdigest()[:32]
