"""Approval cards as Slack blocks: every argument in full (several sections, or an attached file), who
asked, the votes so far, the buttons while it waits, who decided once settled; a budget's Continue / Stop."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from channels.slack.formatting import SLACK_MARKS, escape
from core.display import arguments_text
from core.model import BUDGET_RISK, ApprovalInfo, ApprovalStatus
from core.replies import asked_by

DENY_VIEW = "approval_deny"
# Slack allows 3,000 characters in a section's text and 50 blocks in a message. The arguments are
# never cut: they take several sections, and past _INLINE_SECTIONS (a wall nobody reads in a
# channel) they are attached in full as a file in the thread.
_SECTION_CHARS = 3_000
_CHUNK_CHARS = _SECTION_CHARS - 2 * len("```\n")
_INLINE_SECTIONS = 6
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_OUTCOME_ICON = {ApprovalStatus.APPROVED: ":white_check_mark:", ApprovalStatus.DENIED: ":x:",
                 ApprovalStatus.EXPIRED: ":hourglass:", ApprovalStatus.CANCELLED: ":no_entry_sign:"}


def budget_blocks(request: ApprovalInfo) -> list[dict[str, Any]]:
    """A thread's token budget used up: Continue (one more budget) or Stop."""
    args = request.arguments
    used, budget, more = (int(args.get(k) or 0) for k in ("used", "budget", "more"))
    blocks: list[dict[str, Any]] = [section(
        f":hourglass_flowing_sand: This thread has used {used:,} of its {budget:,}-token budget. "
        f"*Continue* lets it use {more:,} more; *Stop* ends this turn.")]
    if request.status == ApprovalStatus.PENDING:
        value = str(request.id)
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{asked_by(request, SLACK_MARKS)} · expires {_date(request.expires_at)}")}]})
        blocks.append({"type": "actions", "block_id": f"approval:{request.id}", "elements": [
            {"type": "button", "action_id": "approval:approve", "text": {"type": "plain_text", "text": "Continue"},
             "style": "primary", "value": value},
            {"type": "button", "action_id": "approval:stop", "text": {"type": "plain_text", "text": "Stop"},
             "style": "danger", "value": value}]})
    else:
        outcome = {ApprovalStatus.APPROVED: "Continued", ApprovalStatus.DENIED: "Stopped"}.get(request.status)
        said = f"{outcome} by {request.decided_by or 'someone'}" if outcome else request.summary()
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{_OUTCOME_ICON.get(request.status, '')} {_who(escape(said), request.decided_by)}")}]})
    return blocks


def approval_blocks(request: ApprovalInfo, *, attached: str | None = None) -> list[dict[str, Any]]:
    """The card: every argument in full (over several sections, or in the attached file ``attached``)."""
    if request.risk == BUDGET_RISK:
        return budget_blocks(request)
    asked = asked_by(request, SLACK_MARKS)
    shown = arguments_text(request.arguments)
    chunks = _chunks(shown)
    header = f":lock: *{escape(request.agent)}* wants to run `{escape(request.tool)}`"
    if attached is None and len(chunks) <= _INLINE_SECTIONS:
        if len(chunks) > 1:
            header += f" — its arguments in full, in {len(chunks)} parts:"
        body = [section(f"```\n{chunk}\n```") for chunk in chunks]
    else:
        body = [section(_too_long_note(request, len(shown), attached))]
    blocks: list[dict[str, Any]] = [section(header), *body]
    if "⟦" in shown:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            "Marks like ⟦3 spaces⟧, ⟦TAB⟧ or ⟦U+202E⟧ stand for whitespace and invisible characters "
            "in the arguments.")}]})
    if request.status == ApprovalStatus.PENDING:
        progress = request.progress()
        votes = f"{mention_all(escape(progress), request.approved_by)} · " if progress else ""
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{votes}{asked} · expires {_date(request.expires_at)}")}]})
        value = str(request.id)  # only the id: the request itself is in the database
        buttons = [
            {"type": "button", "action_id": "approval:approve", "text": {"type": "plain_text", "text": "Approve"},
             "style": "primary", "value": value},
            {"type": "button", "action_id": "approval:deny", "text": {"type": "plain_text", "text": "Deny"},
             "style": "danger", "value": value},
        ]
        if request.grantable:  # a rule's request: a standing grant would let the call skip the rule from then on
            buttons.append({"type": "button", "action_id": "approval:always",
                            "text": {"type": "plain_text", "text": "Always allow"}, "value": value})
        blocks.append({"type": "actions", "block_id": f"approval:{request.id}", "elements": buttons})
    else:
        icon = _OUTCOME_ICON.get(request.status, "")
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{icon} {mention_all(_who(escape(request.summary()), request.decided_by), request.approved_by)}"
            f" · {asked}")}]})
    return blocks


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
    if request.status == ApprovalStatus.PENDING:
        return f"{request.agent} wants to run {request.tool}: Approve, Deny or Always allow"
    return f"{request.tool}: {_who(request.summary(), request.decided_by)}"


def is_person(who: str) -> bool:
    """A Slack user or group id (not "requester" or "web", which are no one to mention or DM)."""
    return re.fullmatch(r"[UWS][A-Z0-9]+", who.removeprefix("slack:")) is not None


def time_left(left: timedelta) -> str:
    minutes = max(1, round(left.total_seconds() / 60))
    if minutes >= 120:
        return f"{round(minutes / 60)} hours"
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def mention(who: str) -> str:
    who = who.removeprefix("slack:")  # BOT_APPROVERS may name Slack's people with their channel
    if who.startswith("S") and who[1:].isalnum():
        return f"<!subteam^{who}>"
    return f"<@{who}>" if who[:1] in ("U", "W") and who[1:].isalnum() else escape(who)


def mention_all(text: str, users: tuple[str, ...]) -> str:
    """Each Slack user id among ``users`` shown as a mention in ``text`` (the votes so far)."""
    for user in users:
        if user[:1] in ("U", "W") and user[1:].isalnum():
            text = re.sub(rf"(?<![<@A-Z0-9]){re.escape(user)}(?![A-Z0-9>])", f"<@{user}>", text)
    return text


def _who(summary: str, user: str | None) -> str:
    """Mention the decider when it is a Slack user id."""
    if user and user[:1] in ("U", "W") and user[1:].isalnum():
        return summary.replace(f"by {user}", f"by <@{user}>")
    return summary


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


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _date(when: datetime) -> str:
    return f"<!date^{int(when.timestamp())}^{{date_short_pretty}} {{time}}|{when:%Y-%m-%d %H:%M} UTC>"
