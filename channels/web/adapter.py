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
from channels.web.connections import WebConnections
from channels.web.port import WEB_USER, WebPort
from channels.web.request_items import approval_item, connection_item, credential_item
from core.errors import Conflict, CoreError, InvalidInput, NotAllowed, NotFound
from core.events import (
    AnswerDelta,
    ApprovalReminded,
    ApprovalRequested,
    ApprovalResolved,
    ApprovalVoted,
    ConnectionRequested,
    ConnectionResolved,
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
from core.gateway import Gateway
from core.model import Inbound, MessageRef
from core.store import WebSessionStore
from core.text import clean_tree, parse_id

log = logging.getLogger(__name__)

_CONVERSATION_ID = re.compile(r"^[0-9a-f]{32}$")
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_STATIC = {"app.js": "application/javascript", "app.css": "text/css", "index.html": "text/html"}
_KEEPALIVE_S = 15.0
_NO_SUCH_CONVERSATION = ('<!doctype html><meta charset="utf-8"><title>Not found</title>'
                         '<p>No such conversation. <a href="/">Start a new one</a>.</p>')


@dataclass(frozen=True)
class WebConfig:
    token: str | None = None
    secure_cookie: bool = False


class WebChannel:
    name = "web"

    def __init__(self, config: WebConfig, gateway: Gateway, *, logins: WebSessionStore | None = None) -> None:
        self.config = config
        self.gateway = gateway
        self.auth = WebAuth(config.token, logins, gateway.clock, secure_cookie=config.secure_cookie)
        self.started = False
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = {}
        self.port = WebPort(self._publish)  # what core calls on the web chat
        gateway.subscribe(self.render, channel=self.name)

    # -- lifecycle ------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        def guard(handler: Any, **kwargs: Any) -> Any:  # and core's refusals answered by their type
            return self.auth.guard(with_refusals(handler), **kwargs)

        return [
            web.get("/", guard(self._index, page=True)),
            web.get("/c/{cid}", guard(self._conversation_page, page=True)),
            web.get("/static/{name}", guard(self._static, public=True)),
            web.get("/login", guard(self.auth.login_page, public=True)),
            web.post("/login", guard(self.auth.login, public=True)),
            web.post("/logout", guard(self.auth.logout, public=True)),
            web.get("/api/conversations", guard(self._list)),
            web.get("/api/conversations/{cid}", guard(self._conversation)),
            web.post("/api/conversations/{cid}/messages", guard(self._send)),
            web.post("/api/conversations/{cid}/stop", guard(self._stop)),
            web.post("/api/conversations/{cid}/feedback", guard(self._feedback)),
            web.get("/api/conversations/{cid}/events", guard(self._events)),
            web.post("/api/approvals/{id}", guard(self._decide)),
            web.post("/api/approvals/{id}/all", guard(self._decide_all)),
            web.post("/api/approvals/{id}/edit", guard(self._edit)),
            web.post("/api/credentials/{id}", guard(self._provide)),
            web.get("/api/schedules", guard(self._list_schedules)),
            web.post("/api/schedules/{id}/{action}", guard(self._change_schedule)),
            *WebConnections(self.gateway, WEB_USER, self.name).routes(guard),
        ]

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False
        for queues in self._watchers.values():
            for queue in queues:
                queue.put_nowait(None)  # ends the SSE streams so the server can shut down

    async def close(self) -> None:
        pass

    # -- pages ----------------------------------------------------------------------------------

    async def _index(self, _request: web.Request) -> web.Response:
        return web.Response(text=_read_static("index.html"), content_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    async def _conversation_page(self, request: web.Request) -> web.Response:
        # A well-formed id not used yet is a new conversation (the page makes the id); any other names
        # none, ever. The answer never repeats what was asked for.
        if not _CONVERSATION_ID.match(request.match_info["cid"]):
            raise web.HTTPNotFound(text=_NO_SUCH_CONVERSATION, content_type="text/html")
        return await self._index(request)

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        return web.Response(text=_read_static(name), content_type=_STATIC[name],
                            headers={"Cache-Control": "no-cache"})

    # -- API ------------------------------------------------------------------------------------

    async def _list(self, _request: web.Request) -> web.Response:
        sessions = await self.gateway.sessions(self.name)
        return web.json_response({"conversations": [
            {"id": s.id.removeprefix("web:"), "title": s.title or "(empty)", "status": s.status,
             "updated_at": s.updated_at.isoformat()}
            for s in sessions
        ]})

    async def _conversation(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        session = await self.gateway.session(session_id)
        entries = await self.gateway.history(session_id) if session is not None else []
        working = session is not None and await self.gateway.working(session_id)
        return web.json_response({
            "id": request.match_info["cid"],
            "status": session.status if session is not None else "new",
            "working": working,
            "messages": [
                {"id": e.id, "role": e.role, "content": e.content, "tools": list(e.tool_names),
                 "queued": e.queued, "at": e.created_at.isoformat(), "turn": e.turn_id}
                for e in entries
            ],
            "approvals": [approval_item(a) for a in await self.gateway.recent_approvals(session_id)] if session else [],
            "credentials": [credential_item(c) for c in await self.gateway.recent_credentials(session_id)]
            if session else [],
            "connections": [connection_item(c) for c in await self.gateway.recent_connection_requests(session_id)]
            if session else [],
        })

    async def _list_schedules(self, _request: web.Request) -> web.Response:
        rows = await self.gateway.schedules()  # the web chat's own list: every schedule
        return web.json_response({"schedules": [
            {"id": r.id, "when": r.describe(), "destination": r.destination,
             "status": r.status, "creator": r.creator, "prompt": r.prompt, "firings": r.firings,
             "last_outcome": r.last_outcome,
             "can_change": self.gateway.may_change_schedule(r, WEB_USER, channel=self.name)}
            for r in rows]})

    async def _change_schedule(self, request: web.Request) -> web.Response:
        schedule_id = parse_id(request.match_info["id"])
        if schedule_id is None:
            return web.json_response({"error": "schedule ids are numbers"}, status=400)
        message = await self.gateway.change_schedule(schedule_id, request.match_info["action"], by=WEB_USER,
                                                     channel=self.name)
        return web.json_response({"message": message})

    async def _provide(self, request: web.Request) -> web.Response:
        request_id = parse_id(request.match_info["id"])
        if request_id is None:
            return web.json_response({"error": "credential request ids are numbers"}, status=400)
        body = await _json_object(request)
        value = body.get("value")
        if not isinstance(value, str):
            return web.json_response({"error": "value must be text"}, status=400)
        # hosts: optional, comma-separated text or a list; checked (a field error) by the core.
        result = await self.gateway.provide(request_id, value, by=WEB_USER, hosts=body.get("hosts"), channel=self.name)
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
        # The verdict and reason are checked by core (400), then whether the request is this channel's (404).
        result = await self.gateway.decide(request_id, body.get("verdict"), by=WEB_USER, reason=body.get("reason"),
                                           channel=self.name)
        status = 403 if result.refused else 200 if result.won or result.voted else 409
        return web.json_response({"won": result.won, "voted": result.voted, "message": result.message}, status=status)

    async def _decide_all(self, request: web.Request) -> web.Response:
        """Approve all / Deny all of the batch the request belongs to: core decides each call on its own."""
        request_id = parse_id(request.match_info["id"])
        if request_id is None:
            return web.json_response({"error": "approval ids are numbers"}, status=400)
        body = await _json_object(request)
        result = await self.gateway.decide_all(request_id, body.get("verdict"), by=WEB_USER, channel=self.name)
        return web.json_response({"decided": sum(r.won for r in result.results), "message": result.message})

    async def _edit(self, request: web.Request) -> web.Response:
        """Approve the call with changed arguments (JSON text): core checks the edit; 422 says why it was refused."""
        request_id = parse_id(request.match_info["id"])
        if request_id is None:
            return web.json_response({"error": "approval ids are numbers"}, status=400)
        body = await _json_object(request)
        result = await self.gateway.edit(request_id, body.get("arguments"), by=WEB_USER, channel=self.name)
        if not result.won:
            return web.json_response({"error": result.message}, status=422)
        return web.json_response({"won": True, "message": result.message})

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
        result = await self.gateway.accept(message)  # refused: 400, not taking messages now: 503
        self._publish(session_id, {"type": "message.accepted", "outcome": result.outcome.value})
        return web.json_response({"outcome": result.outcome.value, "input_id": result.input_id,
                                  "note": result.note})

    async def _stop(self, request: web.Request) -> web.Response:
        report = await self.gateway.stop(_session_id(request), by=WEB_USER)
        return web.json_response({"stopped": report.running, "waiting_cancelled": report.waiting,
                                  "text": report.describe("web")})

    async def _feedback(self, request: web.Request) -> web.Response:
        """A verdict on one of this conversation's answers: ``{"turn": id, "verdict": "positive"|"negative"}``."""
        body = await _json_object(request)
        result = await self.gateway.feedback(body.get("turn"), body.get("verdict"), by=WEB_USER, channel=self.name,
                                             session_id=_session_id(request))  # refused: 400 / 404
        return web.json_response({"positive": result.positive, "text": result.describe()})

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
        elif isinstance(event, AnswerDelta):
            item.update(turn_id=event.turn.id, text=event.text, restart=event.restart)
        elif isinstance(event, InputsTaken):
            item.update(turn_id=event.turn_id, count=len(event.refs), steered=event.steered)
        elif isinstance(event, InputQueued):
            item.update(input_id=event.input_id)
        elif isinstance(event, Notice):
            item.update(text=event.text)
        elif isinstance(event, ApprovalRequested) and len(event.batch) > 1:  # one model step's calls: each shown
            for request in event.batch:
                self._publish(event.session_id, {**item, "approval": approval_item(request)})
            return
        elif isinstance(event, ApprovalRequested | ApprovalResolved | ApprovalVoted | ApprovalReminded):
            item.update(approval=approval_item(event.request))
        elif isinstance(event, CredentialRequested | CredentialResolved):
            item.update(credential=credential_item(event.request))
        elif isinstance(event, ConnectionRequested | ConnectionResolved):
            item.update(connection=connection_item(event.request))
        else:
            return
        self._publish(event.session_id, item)

    def _publish(self, session_id: str, item: dict[str, Any]) -> None:
        for queue in self._watchers.get(session_id, ()):
            queue.put_nowait(item)


def refusal_status(exc: CoreError) -> int:
    """The HTTP status of one of core's refusals, by its type (core's words are never parsed)."""
    for kind, status in ((NotAllowed, 403), (NotFound, 404), (Conflict, 409), (InvalidInput, 400)):
        if isinstance(exc, kind):
            return status
    return 503  # core could not do it now (not accepting messages, the database out of reach)


def with_refusals(handler: Any) -> Any:
    """Answer core's refusals as JSON with their status. Anything else is a bug: it stays a 500."""
    async def answer(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except CoreError as exc:
            return web.json_response({"error": str(exc)}, status=refusal_status(exc))

    return answer


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
