"""Approvals in Slack: the Block Kit request message, its buttons, the Deny reason modal, and the
in-place update once settled. Every rule (who may decide, settle once) is the broker's."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import PrivateReplies, error_code
from core.approvals import ApprovalBroker
from core.model import ApprovalInfo, ApprovalStatus

log = logging.getLogger(__name__)

ACTION = re.compile(r"^approval:(approve|deny|always)$")
DENY_VIEW = "approval_deny"
_ARG_LIMIT = 300
_ARGS_LIMIT = 2_500
_OUTCOME_ICON = {ApprovalStatus.APPROVED: ":white_check_mark:", ApprovalStatus.DENIED: ":x:",
                 ApprovalStatus.EXPIRED: ":hourglass:", ApprovalStatus.CANCELLED: ":no_entry_sign:"}


class SlackApprovals:
    def __init__(self, app: AsyncApp, client: AsyncWebClient, broker: ApprovalBroker) -> None:
        self.client = client
        self.broker = broker
        self._private = PrivateReplies(client)
        app.action(ACTION)(self._on_click)
        app.view(DENY_VIEW)(self._on_deny_submitted)

    # -- rendering ------------------------------------------------------------------------------

    async def announce(self, request: ApprovalInfo) -> None:
        ref = request.session.reply_ref
        try:
            posted = await self.client.chat_postMessage(
                channel=ref["channel"], thread_ts=ref.get("thread_ts"), text=_fallback(request),
                blocks=approval_blocks(request),
            )
        except SlackApiError as exc:
            log.error("could not post approval %s: %s", request.id, error_code(exc))
            return
        await self.broker.record_announcement(request.id, {"channel": posted["channel"], "ts": posted["ts"]})

    async def resolve(self, request: ApprovalInfo) -> None:
        """Update the request's message in place: no buttons, who decided what."""
        where = request.announcement or (await self.broker.get(request.id) or request).announcement
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
        user = str((body.get("user") or {}).get("id") or "")
        channel = str((body.get("channel") or {}).get("id") or "")
        verdict = ACTION.match(str(action.get("action_id")))
        request_id = _request_id(action.get("value"))
        if verdict is None or request_id is None:
            self._private.tell(channel, user, "That button does not belong to an approval request I know.")
            return
        if verdict.group(1) == "deny":
            request = await self.broker.get(request_id)
            if request is None or request.settled or not await self.broker.may_decide(user, request):
                result = await self.broker.decide(request_id, "deny", by=user)  # refuses, or says what happened
                self._private.tell(channel, user, result.message)
                return
            await self._open_deny_modal(str(body.get("trigger_id") or ""), request)
            return
        result = await self.broker.decide(request_id, verdict.group(1), by=user)
        if not result.won:
            self._private.tell(channel, user, result.message)

    async def _open_deny_modal(self, trigger_id: str, request: ApprovalInfo) -> None:
        try:
            await self.client.views_open(trigger_id=trigger_id, view=deny_modal(request))
        except SlackApiError as exc:  # no modal (e.g. an expired trigger): deny without a reason
            log.warning("could not open the deny modal: %s", error_code(exc))

    async def _on_deny_submitted(self, ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        await ack()
        user = str((body.get("user") or {}).get("id") or "")
        request_id = _request_id(view.get("private_metadata"))
        if request_id is None:
            return
        values = (view.get("state") or {}).get("values") or {}
        reason = str(((values.get("reason") or {}).get("text") or {}).get("value") or "").strip()
        result = await self.broker.decide(request_id, "deny", by=user, reason=reason or None)
        if not result.won and result.request is not None and result.request.announcement:
            self._private.tell(result.request.announcement["channel"], user, result.message)



def approval_blocks(request: ApprovalInfo) -> list[dict[str, Any]]:
    asked = f"Asked by <@{request.requester}>" if request.requester else "Asked by the agent"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": f":lock: *{_escape(request.agent)}* wants to run `{request.tool}`"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"```{_arguments(request.arguments)}```"}},
    ]
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
            f"{icon} {_who(_escape(request.summary()), request.decided_by)} · {asked}")}]})
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


def _arguments(arguments: dict[str, Any]) -> str:
    lines = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text) > _ARG_LIMIT:
            text = text[:_ARG_LIMIT] + f"… ({len(text)} characters)"
        lines.append(f"{key}: {text}")
    joined = "\n".join(lines) or "(no arguments)"
    if len(joined) > _ARGS_LIMIT:
        joined = joined[:_ARGS_LIMIT] + "…"
    return _escape(joined).replace("```", "'''")  # a fence inside would end the code block


def _date(when: datetime) -> str:
    return f"<!date^{int(when.timestamp())}^{{date_short_pretty}} {{time}}|{when:%Y-%m-%d %H:%M} UTC>"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _request_id(value: Any) -> int | None:
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if number > 0 else None
