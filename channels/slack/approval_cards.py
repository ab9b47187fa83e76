"""Approval cards as Slack blocks: every argument in full (several sections, or an attached file), who
asked, the votes so far, the buttons while it waits, who decided once settled; a budget's Continue / Stop."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from channels.slack.formatting import SLACK_MARKS, escape
from channels.slack.payloads import slack_person
from channels.slack.request_cards import (
    Button,
    RequestCard,
    button_element,
    by_mention,
    card_blocks,
    context,
    outcome,
    section,
)
from core.display import arguments_text
from core.grants import lasting
from core.model import BUDGET_RISK, CAP_RISK, EDIT_MAX_CHARS, ApprovalInfo, ApprovalStatus
from core.replies import asked_by
from core.self_approval import needs_other

DENY_VIEW = "approval_deny"
EDIT_VIEW = "approval_edit"
# Slack allows 3,000 characters in a section's text and 50 blocks in a message. The arguments are
# never cut: they take several sections, and past _INLINE_SECTIONS (a wall nobody reads in a
# channel) they are attached in full as a file in the thread.
_SECTION_CHARS = 3_000
_CHUNK_CHARS = _SECTION_CHARS - 2 * len("```\n")
_INLINE_SECTIONS = 6
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def budget_blocks(request: ApprovalInfo) -> list[dict[str, Any]]:
    """A thread's token budget used up: Continue (one more budget) or Stop."""
    args = request.arguments
    used, budget, more = (int(args.get(k) or 0) for k in ("used", "budget", "more"))
    asked = [section(f":hourglass_flowing_sand: This thread has used {used:,} of its {budget:,}-token budget. "
                     f"*Continue* lets it use {more:,} more; *Stop* ends this turn.")]
    pending = request.status == ApprovalStatus.PENDING
    if pending:
        answer = f"{asked_by(request, SLACK_MARKS)} · expires {_date(request.expires_at)}"
    else:
        ended = {ApprovalStatus.APPROVED: "Continued", ApprovalStatus.DENIED: "Stopped"}.get(request.status)
        said = f"{ended} by {request.decided_by or 'someone'}" if ended else request.summary()
        answer = outcome(request, by_mention(escape(said), request.decided_by))
    return card_blocks(RequestCard("approval", request.id, asked, pending, answer, (
        Button("Continue", "approval:approve", "primary"), Button("Stop", "approval:stop", "danger"))))


def cap_blocks(request: ApprovalInfo) -> list[dict[str, Any]]:
    """A spending cap reached (core.spending): an admin's Continue (this turn only) or Stop."""
    args = request.arguments
    asked = [section(f":money_with_wings: {escape(str(args.get('cap') or 'A spending cap'))} is reached "
                     f"({escape(str(args.get('amounts') or ''))}). *Continue* lets this turn go on; other turns still "
                     "stop at the cap. *Stop* ends this turn. Only admins can decide.")]
    pending = request.status == ApprovalStatus.PENDING
    if pending:
        answer = f"{asked_by(request, SLACK_MARKS)} · expires {_date(request.expires_at)}"
    else:
        ended = {ApprovalStatus.APPROVED: "Continued", ApprovalStatus.DENIED: "Stopped"}.get(request.status)
        said = f"{ended} by {request.decided_by or 'someone'}" if ended else request.summary()
        answer = outcome(request, by_mention(escape(said), request.decided_by))
    return card_blocks(RequestCard("approval", request.id, asked, pending, answer, (
        Button("Continue", "approval:approve", "primary"), Button("Stop", "approval:stop", "danger"))))


def approval_blocks(request: ApprovalInfo, *, attached: str | None = None,
                    effect: str | None = None) -> list[dict[str, Any]]:
    """The card: what the call will do (``effect``, mrkdwn, for the tools that say: channels.slack.tool_effects),
    then every argument in full (over several sections, or in the attached file ``attached``)."""
    if request.risk == BUDGET_RISK:
        return budget_blocks(request)
    if request.risk == CAP_RISK:
        return cap_blocks(request)
    asked_by_whom = asked_by(request, SLACK_MARKS)
    shown = arguments_text(request.arguments)
    chunks = _chunks(shown)
    header = f":lock: *{escape(request.agent)}* wants to run `{escape(request.tool)}`"
    if attached is None and len(chunks) <= _INLINE_SECTIONS:
        if len(chunks) > 1:
            header += f" — its arguments in full, in {len(chunks)} parts:"
        body = [section(f"```\n{chunk}\n```") for chunk in chunks]
    else:
        body = [section(_too_long_note(request, len(shown), attached))]
    effect_blocks = [section(effect[:_SECTION_CHARS])] if effect else []
    asked: list[dict[str, Any]] = [section(header), *effect_blocks, *body]
    if "⟦" in shown:
        asked.append(context("Marks like ⟦3 spaces⟧, ⟦TAB⟧ or ⟦U+202E⟧ stand for whitespace and invisible characters "
                             "in the arguments."))
    pending = request.status == ApprovalStatus.PENDING
    if pending:
        progress = request.progress()
        votes = f"{mention_all(escape(progress), request.approved_by)} · " if progress else ""
        step_up = " · approving needs a passkey" if request.step_up else ""  # a rule's step_up (core.passkeys)
        others = needs_other(request, mention)  # self-approval off: whose click will not count
        answer = (f"{votes}{asked_by_whom}{_asking(request)}{f' · {others}' if others else ''}{step_up}"
                  f" · expires {_date(request.expires_at)}")
        if request.grantable and request.grant_ttl_s is not None:  # a rule's grant: the approver should know
            answer += f" · a grant lasts {lasting(request.grant_ttl_s)}"
    else:
        said = mention_all(by_mention(escape(request.summary()), request.decided_by), request.approved_by)
        answer = outcome(request, f"{said} · {asked_by_whom}")
    buttons = [Button("Approve", "approval:approve", "primary"), Button("Deny", "approval:deny", "danger")]
    if request.grantable:  # a rule's request only with grant_ttl_s: a grant would skip the rule from then on
        buttons.append(Button("Always allow", "approval:always"))
    if request.thread_grantable:
        buttons.append(Button("Allow in this thread", "approval:thread"))
    if request.editable:  # core says which (never a call that uses a credential) and checks the edit again
        buttons.append(Button("Edit", "approval:edit"))
    return card_blocks(RequestCard("approval", request.id, [*asked, *_ran_instead(request)], pending, answer,
                                   tuple(buttons)))


def fits_in_batch(request: ApprovalInfo) -> bool:
    """Whether a call's arguments fit its part of a batch card (one section), else the calls get a card each."""
    return request.risk not in (BUDGET_RISK, CAP_RISK) and len(_chunks(arguments_text(request.arguments))) == 1


def batch_blocks(requests: list[ApprovalInfo], effects: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """One card for one model step's gated calls (issue 40.3): each call in full with its own buttons (or how it
    ended), then **Approve all** / **Deny all** while any still waits. Each button carries one request id only;
    the batch is read from the stored request."""
    first = requests[0]
    blocks: list[dict[str, Any]] = [section(f":lock: *{escape(first.agent)}* wants to run {len(requests)} calls:")]
    for number, request in enumerate(requests, 1):
        shown = _chunks(arguments_text(request.arguments))[0]
        blocks.append(section(f"*{number}.* `{escape(request.tool)}`\n```\n{shown}\n```"))
        effect = (effects or {}).get(request.id)
        if effect:
            blocks.append(section(effect[:_SECTION_CHARS]))
        blocks.extend(_ran_instead(request))
        if request.status == ApprovalStatus.PENDING:
            progress = request.progress()
            if progress:
                blocks.append(context(mention_all(escape(progress), request.approved_by)))
            buttons = [Button("Approve", "approval:approve", "primary"), Button("Deny", "approval:deny", "danger")]
            if request.grantable:
                buttons.append(Button("Always allow", "approval:always"))
            if request.thread_grantable:
                buttons.append(Button("Allow in this thread", "approval:thread"))
            if request.editable:
                buttons.append(Button("Edit", "approval:edit"))
            blocks.append({"type": "actions", "block_id": f"approval:{request.id}",
                           "elements": [button_element(b, str(request.id)) for b in buttons]})
        else:
            said = mention_all(by_mention(escape(request.summary()), request.decided_by), request.approved_by)
            blocks.append(context(outcome(request, said)))
    waiting = [r for r in requests if r.status == ApprovalStatus.PENDING]
    asked_by_whom = asked_by(first, SLACK_MARKS)
    if waiting:
        blocks.append(context(f"{asked_by_whom} · expires {_date(min(r.expires_at for r in waiting))}"))
        blocks.append({"type": "actions", "block_id": f"approval_batch:{first.id}", "elements": [
            button_element(Button("Approve all", "approval_batch:approve", "primary"), str(first.id)),
            button_element(Button("Deny all", "approval_batch:deny", "danger"), str(first.id))]})
    else:
        blocks.append(context(f"All {len(requests)} calls settled · {asked_by_whom}"))
    return blocks


def batch_fallback_text(requests: list[ApprovalInfo]) -> str:
    waiting = sum(1 for r in requests if r.status == ApprovalStatus.PENDING)
    tools = ", ".join(r.tool for r in requests)
    if waiting:
        return f"{requests[0].agent} wants to run {len(requests)} calls ({tools}): {waiting} waiting for a decision"
    return f"{len(requests)} calls ({tools}): all settled"


def edit_modal(request: ApprovalInfo) -> dict[str, Any]:
    """The edit box: the call's arguments as pretty JSON. Submitting approves the edited call (core checks it)."""
    return {
        "type": "modal", "callback_id": EDIT_VIEW, "private_metadata": str(request.id),
        "title": {"type": "plain_text", "text": "Edit and approve"},
        "submit": {"type": "plain_text", "text": "Approve edited"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": (
                f"Change the arguments of `{escape(request.tool)}`, then approve the edited call. The policies check "
                "it again, and the agent is told what ran instead.")}},
            {"type": "input", "block_id": "arguments",
             "label": {"type": "plain_text", "text": "Arguments (JSON)"},
             "element": {"type": "plain_text_input", "action_id": "json", "multiline": True,
                         "max_length": EDIT_MAX_CHARS, "initial_value": request.edit_text()}},
        ],
    }


def _ran_instead(request: ApprovalInfo) -> list[dict[str, Any]]:
    """An approved edit: what ran instead of what the model asked."""
    if request.edited_arguments is None:
        return []
    chunks = _chunks(arguments_text(request.edited_arguments))
    who = mention(request.edited_by) if request.edited_by else "an approver"
    return [section(f":pencil2: Edited by {who}; it runs with these arguments instead:"),
            *(section(f"```\n{chunk}\n```") for chunk in chunks[:_INLINE_SECTIONS])]


def _asking(request: ApprovalInfo, limit: int = 5) -> str:
    """Whom the request itself names (a rule's approvers, or the people on call when it was made: core.oncall);
    nothing when it asks the agent's approvers."""
    named = [mention(a) for a in request.approvers if slack_person(a) is not None]
    if not named:
        return ""
    more = f" and {len(named) - limit} more" if len(named) > limit else ""
    return f" · for {', '.join(named[:limit])}{more}"


def deny_modal(request: ApprovalInfo) -> dict[str, Any]:
    return {
        "type": "modal", "callback_id": DENY_VIEW, "private_metadata": str(request.id),
        "title": {"type": "plain_text", "text": "Deny"},
        "submit": {"type": "plain_text", "text": "Deny"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"Deny `{request.tool}`? The agent is told, "
                                                                   "and carries on without it."}},
            {"type": "input", "block_id": "reason", "optional": True,
             "label": {"type": "plain_text", "text": "Reason (the agent sees it)"},
             "element": {"type": "plain_text_input", "action_id": "text", "multiline": True, "max_length": 500}},
        ],
    }


def fallback_text(request: ApprovalInfo) -> str:
    if request.risk == BUDGET_RISK:
        return "This thread used its token budget: Continue or Stop"
    if request.risk == CAP_RISK:
        return "A spending cap is reached: an admin may Continue or Stop"
    if request.status == ApprovalStatus.PENDING:
        choices = ["Approve", "Deny"] + ["Always allow"] * request.grantable + ["Allow in this thread"] * \
            request.thread_grantable
        return f"{request.agent} wants to run {request.tool}: {', '.join(choices[:-1])} or {choices[-1]}"
    return f"{request.tool}: {by_mention(request.summary(), request.decided_by)}"


def time_left(left: timedelta) -> str:
    minutes = max(1, round(left.total_seconds() / 60))
    if minutes >= 120:
        return f"{round(minutes / 60)} hours"
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def mention(who: str) -> str:
    ident = slack_person(who)  # BOT_APPROVERS may name Slack's people with their channel
    if ident is None:
        return escape(who)
    return f"<!subteam^{ident}>" if ident.startswith("S") else f"<@{ident}>"


def mention_all(text: str, users: tuple[str, ...]) -> str:
    """Each Slack user id among ``users`` shown as a mention in ``text`` (the votes so far)."""
    for user in users:
        if user[:1] in ("U", "W") and user[1:].isalnum():
            text = re.sub(rf"(?<![<@A-Z0-9]){re.escape(user)}(?![A-Z0-9>])", f"<@{user}>", text)
    return text


def fits_on_card(request: ApprovalInfo) -> bool:
    """Whether the arguments, in full, fit on the card itself (else they must be attached)."""
    return len(_chunks(arguments_text(request.arguments))) <= _INLINE_SECTIONS


def _chunks(text: str) -> list[str]:
    """``text`` escaped for mrkdwn, in pieces that each fit a section with its code fences: never cut
    inside an escape, and at a line break when one is near (that break is the box's edge)."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for token in (_ESCAPES.get(ch, ch) for ch in text):
        if size + _width(token) > _CHUNK_CHARS:
            cut = next((i for i in range(len(current) - 1, len(current) // 2, -1) if current[i] == "\n"), None)
            chunks.append("".join(current[:cut]))
            current = current[cut + 1:] if cut is not None else []
            size = sum(_width(t) for t in current)
        current.append(token)
        size += _width(token)
    chunks.append("".join(current))
    return chunks


def _width(token: str) -> int:
    """Characters as Slack may count them (UTF-16 units: an emoji can count twice)."""
    return sum(2 if ord(ch) > 0xFFFF else 1 for ch in token)


def _too_long_note(request: ApprovalInfo, length: int, attached: str | None) -> str:
    too_long = f":paperclip: The arguments ({length:,} characters) are too long for this card."
    if request.status == ApprovalStatus.PENDING:
        name = f" (`{attached}`)" if attached else ""
        return f"{too_long} They are attached in full as a file in this thread{name}: read it before you decide."
    if request.announcement:
        return f"{too_long} They are attached in full as a file in this thread."
    return too_long


def _date(when: datetime) -> str:
    return f"<!date^{int(when.timestamp())}^{{date_short_pretty}} {{time}}|{when:%Y-%m-%d %H:%M} UTC>"
