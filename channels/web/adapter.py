"""Web chat adapter: a small JSON API and a server-sent-events stream over core's public interface.

Like the Slack adapter it decides nothing core decides: it turns HTTP requests into ``Gateway``
calls and core events into SSE messages for the browsers watching that conversation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from channels.web.auth import WebAuth
from core.approvals import ApprovalBroker
from core.credentials import CredentialService
from core.dispatcher import Dispatcher
from core.errors import CoreError, InvalidInput
from core.events import (
    ApprovalRequested,
    ApprovalResolved,
    CredentialRequested,
    CredentialResolved,
    Event,
    InputQueued,
    InputsTaken,
    Notice,
    TurnCancelled,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from core.model import ApprovalInfo, CredentialRequestInfo, Inbound, MessageRef
from core.schedules import ScheduleService
from core.store import WebSessionStore
from core.text import clean_tree, parse_id
from core.triggers import TriggerSpec

log = logging.getLogger(__name__)

_CONVERSATION_ID = re.compile(r"^[0-9a-f]{32}$")
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_STATIC = {"app.js": "application/javascript", "app.css": "text/css", "index.html": "text/html"}
_KEEPALIVE_S = 15.0
# Whoever uses the web chat (local, or holding BOT_WEB_TOKEN); may approve as the requester or via BOT_ADMINS.
WEB_USER = "web"


@dataclass(frozen=True)
class WebConfig:
    token: str | None = None
    secure_cookie: bool = False


class WebChannel:
    name = "web"

    def __init__(self, config: WebConfig, dispatcher: Dispatcher, approvals: ApprovalBroker,
                 credentials: CredentialService, schedules: ScheduleService | None = None, *,
                 logins: WebSessionStore | None = None) -> None:
        self.schedules = schedules
        self.config = config
        self.dispatcher = dispatcher
        self.approvals = approvals
        self.credentials = credentials
        self.auth = WebAuth(config.token, logins, dispatcher.clock, secure_cookie=config.secure_cookie)
        self.started = False
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = {}
        dispatcher.bus.subscribe(self.render, channel=self.name)

    # -- lifecycle ------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        guard = self.auth.guard
        return [
            web.get("/", guard(self._index, page=True)),
            web.get("/c/{cid}", guard(self._index, page=True)),
            web.get("/static/{name}", guard(self._static, public=True)),
            web.get("/login", guard(self.auth.login_page, public=True)),
            web.post("/login", guard(self.auth.login, public=True)),
            web.post("/logout", guard(self.auth.logout, public=True)),
            web.get("/api/conversations", guard(self._list)),
            web.get("/api/conversations/{cid}", guard(self._conversation)),
            web.post("/api/conversations/{cid}/messages", guard(self._send)),
            web.post("/api/conversations/{cid}/stop", guard(self._stop)),
            web.get("/api/conversations/{cid}/events", guard(self._events)),
            web.post("/api/approvals/{id}", guard(self._decide)),
            web.post("/api/credentials/{id}", guard(self._provide)),
            web.get("/api/schedules", guard(self._list_schedules)),
            web.post("/api/schedules/{id}/{action}", guard(self._change_schedule)),
        ]

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False
        for queues in self._watchers.values():
            for queue in queues:
                queue.put_nowait(None)  # ends the SSE streams so the server can shut down

    # -- pages ----------------------------------------------------------------------------------

    async def _index(self, _request: web.Request) -> web.Response:
        return web.Response(text=_read_static("index.html"), content_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        return web.Response(text=_read_static(name), content_type=_STATIC[name],
                            headers={"Cache-Control": "no-cache"})

    # -- API ------------------------------------------------------------------------------------

    async def _list(self, _request: web.Request) -> web.Response:
        sessions = await self.dispatcher.list_sessions(self.name)
        return web.json_response({"conversations": [
            {"id": s.id.removeprefix("web:"), "title": s.title or "(empty)", "status": s.status,
             "updated_at": s.updated_at.isoformat()}
            for s in sessions
        ]})

    async def _conversation(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        session = await self.dispatcher.session(session_id)
        entries = await self.dispatcher.history(session_id) if session is not None else []
        working = session is not None and await self.dispatcher.working(session_id)
        return web.json_response({
            "id": request.match_info["cid"],
            "status": session.status if session is not None else "new",
            "working": working,
            "messages": [
                {"id": e.id, "role": e.role, "content": e.content, "tools": list(e.tool_names),
                 "queued": e.queued, "at": e.created_at.isoformat()}
                for e in entries
            ],
            "approvals": [_approval(a) for a in await self.approvals.recent(session_id)] if session else [],
            "credentials": [_credential(c) for c in await self.credentials.recent(session_id)] if session else [],
        })

    async def _list_schedules(self, _request: web.Request) -> web.Response:
        rows = await self.schedules.list() if self.schedules is not None else []
        schedules = self.schedules
        return web.json_response({"schedules": [
            {"id": r.id, "when": TriggerSpec.from_json(r.trigger).describe(), "destination": r.destination,
             "status": r.status, "creator": r.creator, "prompt": r.prompt, "firings": r.firings,
             "last_outcome": r.last_outcome, "can_change": schedules is not None and schedules.may_change(r, WEB_USER)}
            for r in rows]})

    async def _change_schedule(self, request: web.Request) -> web.Response:
        if self.schedules is None:
            return web.json_response({"error": "schedules are not available"}, status=404)
        schedule_id = parse_id(request.match_info["id"])
        if schedule_id is None:
            return web.json_response({"error": "schedule ids are numbers"}, status=400)
        try:
            message = await self.schedules.change(schedule_id, request.match_info["action"], by=WEB_USER)
        except InvalidInput as exc:
            return web.json_response({"error": str(exc)}, status=403 if "only its creator" in str(exc) else 409)
        return web.json_response({"message": message})

    async def _provide(self, request: web.Request) -> web.Response:
        request_id = parse_id(request.match_info["id"])
        if request_id is None:
            return web.json_response({"error": "credential request ids are numbers"}, status=400)
        body = await _json_object(request)
        value = body.get("value")
        if not isinstance(value, str):
            return web.json_response({"error": "value must be text"}, status=400)
        current = await self.credentials.get(request_id)
        if current is None or current.session.channel != self.name:
            return web.json_response({"error": "no such credential request here"}, status=404)
        # hosts: optional, comma-separated text or a list; checked (a field error) by the core.
        result = await self.credentials.provide(request_id, value, by=WEB_USER, hosts=body.get("hosts"))
        if result.stored:
            return web.json_response({"stored": True, "message": result.message})
        status = 400 if result.field_error else 409
        return web.json_response({"stored": False, "error": result.message, "field_error": result.field_error,
                                  "field": result.field if result.field_error else None}, status=status)

    async def _decide(self, request: web.Request) -> web.Response:
        request_id = parse_id(request.match_info["id"])
        if request_id is None:
            return web.json_response({"error": "approval ids are numbers"}, status=400)
        body = await _json_object(request)
        verdict, reason = body.get("verdict"), body.get("reason")
        if verdict not in ("approve", "deny", "always"):
            return web.json_response({"error": "verdict must be approve, deny or always"}, status=400)
        if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
            return web.json_response({"error": "reason must be text of at most 500 characters"}, status=400)
        current = await self.approvals.get(request_id)
        if current is None or current.session.channel != self.name:
            return web.json_response({"error": "no such approval request here"}, status=404)
        result = await self.approvals.decide(request_id, verdict, by=WEB_USER, reason=reason)
        status = 403 if result.refused else 200 if result.won else 409
        return web.json_response({"won": result.won, "message": result.message}, status=status)

    async def _send(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        body = await _json_object(request)
        text, client_id = body.get("text"), body.get("client_id")
        if not isinstance(text, str) or not text.strip():
            return web.json_response({"error": "type a message first"}, status=400)
        if client_id is not None and (not isinstance(client_id, str) or not _CLIENT_ID.match(client_id)):
            return web.json_response({"error": "client_id must be 1-64 letters, digits, - or _"}, status=400)
        message = Inbound(
            session_id=session_id, channel=self.name, sender=WEB_USER, text=text.strip(), addressed=True,
            ref=MessageRef(), idempotency_key=f"web:{client_id}" if client_id else None,
            place=session_id,  # grants and per-place settings belong to this conversation only
        )
        try:
            result = await self.dispatcher.accept(message)
        except InvalidInput as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except CoreError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        self._publish(session_id, {"type": "message.accepted", "outcome": result.outcome.value})
        return web.json_response({"outcome": result.outcome.value, "input_id": result.input_id,
                                  "note": result.note})

    async def _stop(self, request: web.Request) -> web.Response:
        report = await self.dispatcher.cancel(_session_id(request), by=WEB_USER)
        return web.json_response({"stopped": report.running, "waiting_cancelled": report.waiting,
                                  "text": report.describe("web")})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        session_id = _session_id(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._watchers.setdefault(session_id, set()).add(queue)
        try:
            await response.write(b": connected\n\n")
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), _KEEPALIVE_S)
                except TimeoutError:
                    if not await self.auth.logged_in(request):
                        break  # the login was revoked or ran out while the stream was open
                    await response.write(b": keep-alive\n\n")
                    continue
                if item is None:
                    break
                await response.write(f"data: {json.dumps(item)}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            watchers = self._watchers.get(session_id)
            if watchers is not None:
                watchers.discard(queue)
                if not watchers:
                    del self._watchers[session_id]
        return response

    # -- rendering core events ------------------------------------------------------------------

    async def render(self, event: Event) -> None:
        item: dict[str, Any] = {"type": event.name}
        if isinstance(event, TurnFinished):
            item.update(turn_id=event.turn.id, text=event.text)
        elif isinstance(event, TurnFailed):
            item.update(turn_id=event.turn.id, message=event.message)
        elif isinstance(event, TurnCancelled):
            item.update(turn_id=event.turn.id, by=event.by)
        elif isinstance(event, TurnStarted):
            item.update(turn_id=event.turn.id)
        elif isinstance(event, InputsTaken):
            item.update(turn_id=event.turn_id, count=len(event.refs), steered=event.steered)
        elif isinstance(event, InputQueued):
            item.update(input_id=event.input_id)
        elif isinstance(event, Notice):
            item.update(text=event.text)
        elif isinstance(event, ApprovalRequested | ApprovalResolved):
            item.update(approval=_approval(event.request))
        elif isinstance(event, CredentialRequested | CredentialResolved):
            item.update(credential=_credential(event.request))
        else:
            return
        self._publish(event.session_id, item)

    def _publish(self, session_id: str, item: dict[str, Any]) -> None:
        for queue in self._watchers.get(session_id, ()):
            queue.put_nowait(item)


def _approval(a: ApprovalInfo) -> dict[str, Any]:
    return {"id": a.id, "tool": a.tool, "arguments": a.arguments, "status": a.status, "summary": a.summary(),
            "expires_at": a.expires_at.isoformat(), "requester": a.requester, "at": a.parked_at.isoformat()}


def _credential(c: CredentialRequestInfo) -> dict[str, Any]:
    return {"id": c.id, "name": c.name, "reason": c.reason, "scope": c.scope, "status": c.status,
            "summary": c.summary(), "expires_at": c.expires_at.isoformat(), "at": c.created_at.isoformat()}


def _session_id(request: web.Request) -> str:
    cid = request.match_info["cid"]
    if not _CONVERSATION_ID.match(cid):
        raise web.HTTPBadRequest(text=json.dumps({"error": "conversation ids are 32 hex characters"}),
                                 content_type="application/json")
    return f"web:{cid}"


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text=json.dumps({"error": "the body must be a JSON object"}),
                                 content_type="application/json")
    return clean_tree(body)  # no NUL, no lone surrogate (from "\ud800") in anything we store


def _read_static(name: str) -> str:
    return resources.files("channels.web").joinpath("static", name).read_text(encoding="utf-8")
