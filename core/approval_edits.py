"""Batch decisions and edits of approval requests (issue 40.3).

**Approve all** / **Deny all**: one decision per still-pending request of a batch, each through the broker's own
``decide`` (who may decide, quorum, the turn's trust), so each is recorded and settled on its own.

**Edit**: an approver changes a call's arguments and approves the edited call. Core checks it, never the channel:
the editor may decide, and self-approval is on (an edited call is the editor's own: with four eyes, never
approved by them alone); the tool's schema and its own check accept the new arguments; the edited call passes the
policies again (a deny rule wins); it needs nobody but the editor (never an edit that lowers the bar); no credential
and no secret value is in either version. The edit is stored with the approval in one commit, audited with both
versions, and the runner runs the edited arguments.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from core.approval_policy import DecideResult
from core.approvals import ApprovalBroker
from core.errors import NotFound
from core.model import BUDGET_RISK, CAP_RISK, EDIT_MAX_CHARS, ApprovalInfo, ApprovalStatus, carries_credential
from core.policies import PolicyAction
from core.self_approval import REFUSED, barred
from core.tools import DESTINATION_TOOL, Risk, ToolContext, ToolError, ToolRegistry, canonical_call, precheck_call

log = logging.getLogger(__name__)

BATCH_VERDICTS = ("approve", "deny")
EDIT_IS_OWN = ("This call can't be edited: self-approval is off here, and an edited call would be yours, approved by "
               "you alone. Approve or deny it as asked; to run something else, ask for it, and someone else approves.")


class Masks(Protocol):
    async def redact(self, text: str) -> str: ...


@dataclass(frozen=True)
class BatchDecision:
    """What an Approve all / Deny all achieved, request by request (those already settled are left out)."""

    results: tuple[DecideResult, ...]

    @property
    def message(self) -> str:
        """For the clicker: what stayed pending and why (nothing, when every one was decided)."""
        refused = [r for r in self.results if r.refused is not None and r.request is not None]
        voted = [r for r in self.results if r.voted and r.request is not None]
        lines = []
        reasons: dict[str, list[str]] = {}
        for r in refused:  # by id only: a forged id must not show what another conversation's calls are
            assert r.request is not None and r.refused is not None
            reasons.setdefault(r.refused, []).append(f"request {r.request.id}")
        for reason, ids in reasons.items():
            lines.append(f"Still waiting — {', '.join(ids)}: {reason}")
        for r in voted:
            assert r.request is not None
            lines.append(f"Request {r.request.id} needs more approvers: {r.request.progress()}.")
        # A step_up call counts only once confirmed with a passkey: its one-time link (or how to enrol), which only
        # the clicker is told, each naming its request.
        lines += [r.step_up for r in self.results if r.step_up is not None and r.request is not None]
        if not self.results:
            lines.append("Every call of this card was already settled.")
        return " ".join(lines)


@dataclass(frozen=True)
class EditResult:
    """An edit: ``won`` when it approved the edited call; else ``problem`` says why not (for the modal)."""

    won: bool
    request: ApprovalInfo | None
    problem: str | None = None

    @property
    def message(self) -> str:
        if self.problem is not None:
            return self.problem
        assert self.request is not None
        return self.request.summary() + "."


class ApprovalEdits:
    def __init__(self, broker: ApprovalBroker, tools: ToolRegistry, masks: Masks | None = None) -> None:
        self.broker = broker
        self.tools = tools
        self.masks = masks  # the secrets' masks: a call that holds a secret's value is never edited

    # -- Approve all / Deny all -----------------------------------------------------------------------------------

    async def decide_all(self, request_id: int, verdict: str, by: str) -> BatchDecision:
        """Every still-pending request of ``request_id``'s batch, each decided on its own by ``by``."""
        request = await self.broker.get(request_id)
        if request is None:
            raise NotFound("no such approval request")
        batch = await self.batch(request)
        results = []
        for member in batch:
            if member.settled:
                continue
            results.append(await self.broker.decide(member.id, verdict, by))
        return BatchDecision(tuple(results))

    async def batch(self, request: ApprovalInfo) -> list[ApprovalInfo]:
        """Every request of ``request``'s batch as it now stands, in call order (just ``request`` without one). The
        batch is read from the stored request, never from what a click carries."""
        if request.batch is None:
            return [request]
        return await self.broker.store.batch(request.session.id, request.batch) or [request]

    # -- Edit -----------------------------------------------------------------------------------------------------

    async def may_edit(self, request_id: int, by: str) -> ApprovalInfo | str:
        """Before the edit box opens: the request, or why ``by`` may not edit it."""
        request = await self.broker.get(request_id)
        if request is None:
            raise NotFound("no such approval request")
        return await self._refusal(request, by) or request

    async def edit(self, request_id: int, text: str, by: str) -> EditResult:
        """Approve the call with ``text`` (a JSON object) as its arguments, if every check passes."""
        request = await self.broker.get(request_id)
        if request is None:
            raise NotFound("no such approval request")
        refused = await self._refusal(request, by)
        if refused is not None:
            return EditResult(False, request, refused)
        tool = self.tools.get(request.tool)
        if tool is None:  # never another tool: the edit box holds arguments only
            return EditResult(False, request, f"`{request.tool}` is not a tool here any more.")
        if len(text) > EDIT_MAX_CHARS * 2:
            return EditResult(False, request, "The arguments are too long.")
        try:
            args = tool.parse_arguments(text)
        except ToolError as exc:
            return EditResult(False, request, f"Not accepted: {exc}")
        if canonical_call(args) == canonical_call(request.arguments):
            return EditResult(False, request, "Nothing was changed: use Approve to run the call as it is.")
        if carries_credential(args):
            return EditResult(False, request, "An edit can't add a credential to a call.")
        if self.masks is not None:
            shown = json.dumps(args, ensure_ascii=False)
            if await self.masks.redact(shown) != shown:
                return EditResult(False, request, "The new arguments contain the value of a secret: name it instead.")
        ctx = ToolContext(session_id=request.session.id, turn_id=request.turn_id or 0, agent=request.agent,
                          sender=request.requester, place=request.session.place, session=request.session,
                          senders=tuple(s for s in (request.requester, *request.other_senders) if s))
        try:
            await precheck_call(tool, ctx, args)
        except ToolError as exc:
            return EditResult(False, request, f"Not accepted: {exc}")
        problem = await self._policy_problem(request, tool.name, args, tool.risk, by)
        if problem is not None:
            await self.broker.store.audit(self.broker.clock.now(), by, "approval.edit_refused",
                                          f"approval:{request.id}", {"tool": request.tool, "why": problem,
                                                                     "edited_arguments": args})
            return EditResult(False, request, problem)
        won, settled = await self.broker.store.approve_edited(
            request.id, args, by=by, now=self.broker.clock.now(),
            detail={"arguments": request.arguments, "edited_arguments": args, "edited_by": by})
        assert settled is not None
        if won:
            log.info("approval %s: approved with changes by %s", request.id, by)
            self.broker.requests.settled_here(settled)
            return EditResult(True, settled)
        if not settled.settled:  # refused only because it ran out of time
            _won, settled = await self.broker.requests.end(request.id, ApprovalStatus.EXPIRED)
        return EditResult(False, settled, f"Already settled: {settled.summary()}.")

    async def _refusal(self, request: ApprovalInfo, by: str) -> str | None:
        if request.settled:
            return f"Already settled: {request.summary()}."
        why = await self.broker.policy.untrusted(by, request.session, "approve", f"approval:{request.id}")
        if why is not None:
            return why
        if not await self.broker.may_decide(by, request):
            return "You can't edit this: you are not one of its approvers."
        # An edit approves: whatever refuses an approval refuses it (the asker's own, a freeze, a passkey rule).
        if barred(request, by):
            return REFUSED
        if not request.self_approval:  # the edited call is the editor's own words: four eyes never become two
            return EDIT_IS_OWN
        if (frozen := await self.broker.frozen_approval(request, by)) is not None:
            return frozen
        if request.step_up:
            return ("This call's rule needs the approver's passkey (step_up), which an edit can't carry: use Approve "
                    "and confirm on the bot's page, or Deny it and ask for the call you want instead.")
        if request.risk in (BUDGET_RISK, CAP_RISK) or request.tool == DESTINATION_TOOL:
            return "This request can't be edited."
        if request.quorum > 1:
            return (f"This call needs {request.quorum} approvers; an edit is one person's decision, so it can't be "
                    "edited. Deny it and ask for the call you want instead.")
        tool = self.tools.get(request.tool)
        if carries_credential(request.arguments) or (tool is not None and tool.sends_credential):
            return "A call that uses a credential can't be edited."
        if tool is not None and not tool.editable:
            return ("This call can't be edited: what it makes stands in the name of the person who asked for it, who "
                    "never wrote your changes. Deny it, and ask for the call you want instead.")
        if self.masks is not None:
            shown = json.dumps(request.arguments, ensure_ascii=False)
            if await self.masks.redact(shown) != shown:
                return "This call's arguments hold a secret's value, so it can't be edited."
        return None

    async def _policy_problem(self, request: ApprovalInfo, tool: str, args: dict[str, Any], risk: Risk,
                              by: str) -> str | None:
        """Why the policies refuse the edited call, or would need more than the editor to approve it."""
        trust = self.broker.policy.trust
        level = (await trust.level(request.session.channel, request.requester, request.session.place)
                 if trust is not None and request.requester else None)
        ruling = self.broker.policies.rule(tool, args, risk=Risk.GATED if request.risk == Risk.GATED.value else risk,
                                           trust=level)
        if ruling.action is PolicyAction.DENY:
            assert ruling.policy is not None
            return (f"The approval policy refuses the edited call ({ruling.policy.describe()}), so it was not "
                    "approved; the request still waits.")
        if ruling.action is PolicyAction.ALLOW:
            return None
        described = ruling.policy.describe() if ruling.policy is not None else None
        if described != request.policy:  # another rule's approvers, quorum or conditions: never swapped by an edit
            return (f"The edited call falls under {described or 'no rule'} instead of "
                    f"{request.policy or 'no rule'}; it needs that rule's own request, so it was not approved.")
        if ruling.policy is not None and ruling.policy.quorum > 1:
            return f"The edited call needs {ruling.policy.quorum} approvers; an edit is one person's decision."
        # The same rule as the request's: its approvers are the request's own (whoever was on call then, those who
        # joined at a reminder), which the editor was checked against (``_refusal``), as an approval is.
        return None
