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
from core.dispatcher import Dispatcher
from core.errors import CoreError, InvalidInput
from core.events import Event, InputQueued, InputsTaken, Notice, TurnCancelled, TurnFailed, TurnFinished, TurnStarted
from core.model import Inbound, MessageRef

log = logging.getLogger(__name__)

_CONVERSATION_ID = re.compile(r"^[0-9a-f]{32}$")
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_STATIC = {"app.js": "application/javascript", "app.css": "text/css", "index.html": "text/html"}
_KEEPALIVE_S = 15.0


@dataclass(frozen=True)
class WebConfig:
    token: str | None = None
    secure_cookie: bool = False


class WebChannel:
    name = "web"

    def __init__(self, config: WebConfig, dispatcher: Dispatcher) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.auth = WebAuth(config.token, secure_cookie=config.secure_cookie)
        self.started = False
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = {}
        dispatcher.bus.subscribe(self.render, channel=self.name)

    # -- lifecycle ------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        guard = self.auth.guard
        return [
            web.get("/", guard(self._index, page=True)),
            web.get("/c/{cid}", guard(self._index, page=True)),
            web.get("/static/{name}", self._static),
            web.get("/login", self.auth.login_page),
            web.post("/login", self.auth.login),
            web.get("/api/conversations", guard(self._list)),
            web.get("/api/conversations/{cid}", guard(self._conversation)),
            web.post("/api/conversations/{cid}/messages", guard(self._send)),
            web.post("/api/conversations/{cid}/stop", guard(self._stop)),
            web.get("/api/conversations/{cid}/events", guard(self._events)),
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
        })

    async def _send(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        body = await _json_object(request)
        text, client_id = body.get("text"), body.get("client_id")
        if not isinstance(text, str) or not text.strip():
            return web.json_response({"error": "type a message first"}, status=400)
        if client_id is not None and (not isinstance(client_id, str) or not _CLIENT_ID.match(client_id)):
            return web.json_response({"error": "client_id must be 1-64 letters, digits, - or _"}, status=400)
        message = Inbound(
            session_id=session_id, channel=self.name, sender="web", text=text.strip(), addressed=True,
            ref=MessageRef(), idempotency_key=f"web:{client_id}" if client_id else None,
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
        report = await self.dispatcher.cancel(_session_id(request), by="web")
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
        else:
            return
        self._publish(event.session_id, item)

    def _publish(self, session_id: str, item: dict[str, Any]) -> None:
        for queue in self._watchers.get(session_id, ()):
            queue.put_nowait(item)


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
    return body


def _read_static(name: str) -> str:
    return resources.files("channels.web").joinpath("static", name).read_text(encoding="utf-8")
