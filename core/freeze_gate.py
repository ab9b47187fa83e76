"""How a change freeze bears on one gated call or one decision (SPEC §17 clarifications), for the approval broker.

A call is *gated* when its tool's risk is gated or a rule asks about it. During a freeze a gated call is refused
however it would run (an allow rule, a grant, a firing's pre-approved destination, no rule at all), unless the
rule that decides it says ``during_freeze = "ask"``: then it is asked even where it would have run unasked, and
only admins (or an operator) may approve it while the freeze lasts.
"""

from __future__ import annotations

from collections.abc import Callable

from core.model import BUDGET_RISK, CAP_RISK, ApprovalInfo
from core.policies import Policy, PolicyAction, PolicyBook, Ruling
from core.tools import DESTINATION_TOOL, Risk, Tool

ASK = "ask"
OPERATOR = "operator"  # how the CLI's overrides are signed (bot.operator.operator_name: "operator:<login>")


def is_gated(tool: Tool, ruling: Ruling) -> bool:
    """Whether a freeze covers the call: a deny is refused anyway, and a safe call no rule asks about runs."""
    return ruling.action is not PolicyAction.DENY and (tool.risk is Risk.GATED or ruling.action is PolicyAction.ASK)


def asks_during_freeze(policy: Policy | None) -> bool:
    return policy is not None and policy.during_freeze == ASK


def frozen_request(request: ApprovalInfo) -> bool:
    """Whether a freeze covers approving this request: a tool call's, not a thread budget's nor a spending cap's
    Continue (no tool runs on it) nor a schedule's destination (its firings' calls are refused when they run)."""
    return request.risk not in (BUDGET_RISK, CAP_RISK) and request.tool != DESTINATION_TOOL


def rule_of(request: ApprovalInfo, policies: PolicyBook) -> Policy | None:
    """The rule that asked (the request keeps its description, which names its place and its words)."""
    if request.policy is None:
        return None
    return next((p for p in policies.policies if p.describe() == request.policy), None)


def approved_by_admin(request: ApprovalInfo, is_admin: Callable[[str], bool]) -> bool:
    """Whether an admin (or an operator) is among those who approved it."""
    deciders = (*request.approved_by, *([request.decided_by] if request.decided_by else []))
    return any(d == OPERATOR or d.startswith(f"{OPERATOR}:") or is_admin(d) for d in deciders)
