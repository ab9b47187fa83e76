"""Credential requests in Slack: a Provide button, a modal to type the value into, field errors,
and the message updated once stored. The value goes from the modal straight to the vault."""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import PrivateReplies, error_code
from channels.slack.formatting import escape
from channels.slack.payloads import channel_id, user_id
from channels.slack.request_cards import (
    Button,
    CardMessages,
    RequestCard,
    by_mention,
    card_blocks,
    carried_id,
    outcome,
    section,
    until,
)
from channels.slack.threads import SessionThreads
from channels.slack.workspaces import in_workspace, request_workspace
from core.display import shown_reason
from core.errors import NotFound
from core.gateway import Gateway
from core.model import CredentialRequestInfo, CredentialStatus

log = logging.getLogger(__name__)

ACTION = "credential:provide"
VIEW = "credential_provide"
UNKNOWN_REQUEST = "That credential request does not exist."  # core's words for an unknown id, said here too


class SlackCredentials:
    def __init__(self, app: AsyncApp, client: AsyncWebClient, gateway: Gateway, channel: str,
                 threads: SessionThreads | None = None) -> None:
        self.client = client
        self.gateway = gateway
        self.channel = channel  # the channel's name in core ("slack"): whose people click here
        self._private = PrivateReplies(client)
        self._cards = CardMessages(client, "credential request", threads or SessionThreads(gateway))
        app.action(ACTION)(self._on_provide_clicked)
        app.view(VIEW)(self._on_submitted)

    async def announce(self, request: CredentialRequestInfo) -> None:
        where = await self._cards.post(request, _fallback(request), request_blocks(request))
        if where is not None:
            await self.gateway.credential_shown(request.id, where)

    async def resolve(self, request: CredentialRequestInfo) -> None:
        where = request.announcement or (await self.gateway.credential_request(request.id) or request).announcement
        if where:
            await self._cards.update(request, where, _fallback(request), request_blocks(request))
        else:  # never shown (Slack was down): say how it ended instead
            await self._cards.post(request, _fallback(request), request_blocks(request))

    async def _on_provide_clicked(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user, channel = user_id(body), channel_id(body)  # shapes checked before bolt (payloads.shape_problem)
        request_id = carried_id(action.get("value"))
        if request_id is None:
            self._private.tell(channel, user, "That button does not belong to a credential request I know.")
            return
        with in_workspace(await self._workspace_of(request_id)):
            await self._provide_clicked(user, channel, request_id, str(body.get("trigger_id") or ""))

    async def _workspace_of(self, request_id: int) -> str | None:
        return await request_workspace(self.client, self.gateway.credential_request, request_id)

    async def _provide_clicked(self, user: str, channel: str, request_id: int, trigger: str) -> None:
        try:
            prompt = await self.gateway.provide_prompt(request_id, by=user, channel=self.channel)
        except NotFound:  # unknown, or another channel's: none that a click here can answer
            prompt = UNKNOWN_REQUEST
        if isinstance(prompt, str):
            self._private.tell(channel, user, prompt)  # why not: core's words, in core's order
        else:
            try:
                await self.client.views_open(trigger_id=trigger, view=provide_modal(prompt))
            except SlackApiError as exc:
                log.warning("could not open the credential modal: %s", error_code(exc))
                self._private.tell(channel, user, "Slack would not open the form; click Provide again.")

    async def _on_submitted(self, ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        user = user_id(body)
        state = view.get("state")
        values = state.get("values") if isinstance(state, dict) else None
        value, hosts = _input_text(values, "value"), _input_text(values, "hosts")  # hosts: optional, null if empty
        request_id = carried_id(view.get("private_metadata")) or 0
        with in_workspace(await self._workspace_of(request_id)):
            try:
                result = await self.gateway.provide(request_id, value, by=user, hosts=hosts, channel=self.channel)
            except NotFound:  # unknown, or another channel's: nothing stored; the modal says so
                await ack(response_action="errors", errors={"value": UNKNOWN_REQUEST})
                return
        if result.stored:
            await ack()  # closes the modal; the request's message is updated through the event
        else:  # the modal stays open and says why next to the field; nothing was stored
            field = result.field if result.field_error else "value"
            await ack(response_action="errors", errors={field: result.field_error or result.message})


def request_blocks(request: CredentialRequestInfo) -> list[dict[str, Any]]:
    who = f"<@{request.requester}> or an approver" if request.requester else "an approver"
    asked = [section(f":key: *{escape(request.agent)}* needs the credential `{request.name}` ({request.scope} scope)"),
             reason_block(request)]
    pending = request.status == CredentialStatus.PENDING
    answer = (f"{who} may provide it · expires {until(request.expires_at)} · the value is sealed and never shown again"
              if pending else outcome(request, by_mention(request.summary(), request.provided_by)))
    return card_blocks(RequestCard("credential", request.id, asked, pending, answer,
                                   (Button("Provide", ACTION, "primary"),)))


def provide_modal(request: CredentialRequestInfo) -> dict[str, Any]:
    return {
        "type": "modal", "callback_id": VIEW, "private_metadata": str(request.id),  # the id only, never a value
        "title": {"type": "plain_text", "text": "Provide a credential"},
        "submit": {"type": "plain_text", "text": "Store"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": (
                f"*{request.name}* for agent *{escape(request.agent)}* ({request.scope} scope)")}},
            reason_block(request),
            {"type": "context", "elements": [{"type": "mrkdwn", "text": (
                ":warning: Slack has no hidden input: the value is visible while you type. Once stored it is "
                "sealed and never shown again, never logged, never sent to the model.")}]},
            {"type": "input", "block_id": "value", "label": {"type": "plain_text", "text": "Value"},
             "element": {"type": "plain_text_input", "action_id": "value", "multiline": True}},
            {"type": "input", "block_id": "hosts", "optional": True,
             "label": {"type": "plain_text", "text": "Allowed hosts (comma-separated)"},
             "hint": {"type": "plain_text", "text": (
                 "Where http_request may send it, e.g. api.github.com, *.example.com. Empty: any host.")},
             "element": {"type": "plain_text_input", "action_id": "hosts", "max_length": 2000,
                         "placeholder": {"type": "plain_text", "text": "api.github.com"}}},
        ],
    }


def reason_block(request: CredentialRequestInfo) -> dict[str, Any]:
    """The model's reason, quoted as its words: one code span (no bold, links or mentions inside),
    ``verbatim`` (Slack links nothing), every character visible (core.display.shown_reason)."""
    quoted = escape(shown_reason(request.reason)).replace("`", "⟦backtick⟧")
    return {"type": "section", "text": {"type": "mrkdwn", "verbatim": True,
                                        "text": f"Reason given by the agent: `{quoted}`"}}


def _fallback(request: CredentialRequestInfo) -> str:
    if request.status == CredentialStatus.PENDING:
        return f"{request.agent} needs the credential {request.name}: Provide"
    return request.summary()


def _input_text(values: Any, block: str) -> str:
    """What was typed into one input of a submitted modal ("" when empty, missing or malformed)."""
    field = values.get(block) if isinstance(values, dict) else None
    element = field.get(block) if isinstance(field, dict) else None
    text = element.get("value") if isinstance(element, dict) else None
    return text if isinstance(text, str) else ""
