"""Approvals in Slack: the Block Kit request message, its buttons, the Deny reason modal, and the
in-place update once settled. Every rule (who may decide, settle once) is core's (through the Gateway)."""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import PrivateReplies, error_code
from channels.slack.formatting import SLACK_MARKS, escape
from channels.slack.payloads import channel_id, input_value, user_id
from core.display import arguments_text
from core.errors import InvalidInput
from core.gateway import Gateway
from core.model import ApprovalInfo, ApprovalStatus
from core.replies import asked_by

log = logging.getLogger(__name__)

ACTION = re.compile(r"^approval:(approve|deny|always)$")
DENY_VIEW = "approval_deny"
# Slack allows 3,000 characters in a section's text and 50 blocks in a message. The arguments are
# never cut: they take several sections, and past _INLINE_SECTIONS (a wall nobody reads in a
# channel) they are attached in full as a file in the thread.
_SECTION_CHARS = 3_000
_CHUNK_CHARS = _SECTION_CHARS - 2 * len("```\n")
_INLINE_SECTIONS = 6
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_TOO_BIG = {"invalid_blocks", "msg_too_long", "too_many_blocks", "msg_blocks_too_long"}
_OUTCOME_ICON = {ApprovalStatus.APPROVED: ":white_check_mark:", ApprovalStatus.DENIED: ":x:",
                 ApprovalStatus.EXPIRED: ":hourglass:", ApprovalStatus.CANCELLED: ":no_entry_sign:"}


class SlackApprovals:
    def __init__(self, app: AsyncApp, client: AsyncWebClient, gateway: Gateway) -> None:
        self.client = client
        self.gateway = gateway
        self._private = PrivateReplies(client)
        app.action(ACTION)(self._on_click)
        app.view(DENY_VIEW)(self._on_deny_submitted)

    # -- rendering ------------------------------------------------------------------------------

    async def announce(self, request: ApprovalInfo) -> None:
        ref = request.session.reply_ref
        attached = None
        if not request.settled and not fits_on_card(request):
            # The file goes first, so no button is ever shown before the arguments can be read.
            attached = await self._attach(request)
            if attached is None:
                await self.gateway.approval_unshowable(request.id)
                return
        for attempt in range(2):
            try:
                posted = await self.client.chat_postMessage(
                    channel=ref["channel"], thread_ts=ref.get("thread_ts"), text=_fallback(request),
                    blocks=approval_blocks(request, attached=attached),
                )
                break
            except SlackApiError as exc:
                log.error("could not post approval %s: %s", request.id, error_code(exc))
                if attempt or attached is not None or request.settled or error_code(exc) not in _TOO_BIG:
                    return  # e.g. Slack is down: it stays pending, and expires if nobody can decide
            # Slack would not take the arguments on the card after all: attach them, or refuse the call.
            attached = await self._attach(request)
            if attached is None:
                await self.gateway.approval_unshowable(request.id)
                return
        await self.gateway.approval_shown(request.id, {"channel": posted["channel"], "ts": posted["ts"]})

    async def _attach(self, request: ApprovalInfo) -> str | None:
        """Post the arguments in full as a file in the request's thread; its name, or None if that failed."""
        ref = request.session.reply_ref
        filename = f"approval-{request.id}-arguments.txt"
        content = (f"Approval request {request.id}: {request.agent} wants to run {request.tool}.\n"
                   "Every argument in full. Whitespace and invisible characters are shown as marks like "
                   "⟦3 spaces⟧ or ⟦U+202E⟧.\n\n" + arguments_text(request.arguments) + "\n")
        try:
            await self.client.files_upload_v2(channel=ref["channel"], thread_ts=ref.get("thread_ts"),
                                              content=content, filename=filename,
                                              title=f"Arguments of approval request {request.id}")
        except Exception as exc:  # whatever went wrong, nobody can read them: core refuses the call
            log.error("could not attach the arguments of approval %s: %s", request.id,
                      error_code(exc) if isinstance(exc, SlackApiError) else type(exc).__name__)
            return None
        return filename

    async def resolve(self, request: ApprovalInfo) -> None:
        """Update the request's message in place: no buttons, who decided what."""
        where = request.announcement or (await self.gateway.approval(request.id) or request).announcement
        try:
            if where:
                await self.client.chat_update(channel=where["channel"], ts=where["ts"], text=_fallback(request),
                                              blocks=approval_blocks(request))
            else:  # never announced (Slack was down): say how it ended instead
                ref = request.session.reply_ref
                await self.client.chat_postMessage(channel=ref["channel"], thread_ts=ref.get("thread_ts"),
                                                   text=_fallback(request), blocks=approval_blocks(request))
        except SlackApiError as exc:
            log.error("could not update approval %s: %s", request.id, error_code(exc))

    # -- interactions ---------------------------------------------------------------------------

    async def _on_click(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user, channel = user_id(body), channel_id(body)  # shapes checked before bolt (payloads.shape_problem)
        if not user:
            return
        verdict = ACTION.match(str(action.get("action_id")))
        request_id = _request_id(action.get("value"))
        if verdict is None or request_id is None:
            self._private.tell(channel, user, "That button does not belong to an approval request I know.")
            return
        if verdict.group(1) == "deny":
            prompt = await self.gateway.deny_prompt(request_id, by=user)
            if isinstance(prompt, ApprovalInfo):  # it may be denied: ask why first
                await self._open_deny_modal(str(body.get("trigger_id") or ""), prompt)
            else:  # refused, or it had already been settled
                self._private.tell(channel, user, prompt.message)
            return
        result = await self.gateway.decide(request_id, verdict.group(1), by=user)
        if not result.won:
            self._private.tell(channel, user, result.message)

    async def _open_deny_modal(self, trigger_id: str, request: ApprovalInfo) -> None:
        try:
            await self.client.views_open(trigger_id=trigger_id, view=deny_modal(request))
        except SlackApiError as exc:  # no modal (e.g. an expired trigger): deny without a reason
            log.warning("could not open the deny modal: %s", error_code(exc))

    async def _on_deny_submitted(self, ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        await ack()
        user = user_id(body)
        request_id = _request_id(view.get("private_metadata"))
        if request_id is None or not user:
            return
        reason = input_value(view, "reason", "text").strip()
        try:
            result = await self.gateway.decide(request_id, "deny", by=user, reason=reason or None)
        except InvalidInput as exc:  # e.g. a reason longer than the modal allows: nothing was decided
            log.warning("deny of approval %s refused: %s", request_id, exc)
            return
        if not result.won and result.request is not None and result.request.announcement:
            self._private.tell(result.request.announcement["channel"], user, result.message)



def approval_blocks(request: ApprovalInfo, *, attached: str | None = None) -> list[dict[str, Any]]:
    """The card: every argument in full (over several sections, or in the attached file ``attached``)."""
    asked = asked_by(request, SLACK_MARKS)
    shown = arguments_text(request.arguments)
    chunks = _chunks(shown)
    header = f":lock: *{escape(request.agent)}* wants to run `{escape(request.tool)}`"
    if attached is None and len(chunks) <= _INLINE_SECTIONS:
        if len(chunks) > 1:
            header += f" — its arguments in full, in {len(chunks)} parts:"
        body = [_section(f"```\n{chunk}\n```") for chunk in chunks]
    else:
        body = [_section(_too_long_note(request, len(shown), attached))]
    blocks: list[dict[str, Any]] = [_section(header), *body]
    if "⟦" in shown:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            "Marks like ⟦3 spaces⟧, ⟦TAB⟧ or ⟦U+202E⟧ stand for whitespace and invisible characters "
            "in the arguments.")}]})
    if request.status == ApprovalStatus.PENDING:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{asked} · expires {_date(request.expires_at)}")}]})
        value = str(request.id)  # only the id: the request itself is in the database
        blocks.append({"type": "actions", "block_id": f"approval:{request.id}", "elements": [
            {"type": "button", "action_id": "approval:approve", "text": {"type": "plain_text", "text": "Approve"},
             "style": "primary", "value": value},
            {"type": "button", "action_id": "approval:deny", "text": {"type": "plain_text", "text": "Deny"},
             "style": "danger", "value": value},
            {"type": "button", "action_id": "approval:always",
             "text": {"type": "plain_text", "text": "Always allow"}, "value": value},
        ]})
    else:
        icon = _OUTCOME_ICON.get(request.status, "")
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{icon} {_who(escape(request.summary()), request.decided_by)} · {asked}")}]})
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


def _fallback(request: ApprovalInfo) -> str:
    if request.status == ApprovalStatus.PENDING:
        return f"{request.agent} wants to run {request.tool}: Approve, Deny or Always allow"
    return f"{request.tool}: {_who(request.summary(), request.decided_by)}"


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


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _date(when: datetime) -> str:
    return f"<!date^{int(when.timestamp())}^{{date_short_pretty}} {{time}}|{when:%Y-%m-%d %H:%M} UTC>"


def _request_id(value: Any) -> int | None:
    """The request id our own blocks carry: a string of digits, nothing else (not a JSON number, not "+1")."""
    if not isinstance(value, str) or re.fullmatch(r"[0-9]{1,18}", value) is None:
        return None
    return int(value) or None
