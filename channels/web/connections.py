"""The web chat's connections: the list (``/api/connections``), disconnecting one, and the personal
Connect link of a parked request (``/oauth/connect/<id>``, for the signed-in web user only)."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from core.gateway import Gateway
from core.views import ConnectionView

_ID = re.compile(r"[0-9]{1,18}")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


class WebConnections:
    def __init__(self, gateway: Gateway, user: str, channel: str) -> None:
        self.gateway = gateway
        self.user = user  # the web chat's one person
        self.channel = channel

    def routes(self, guard: Any) -> list[web.RouteDef]:
        return [web.get("/api/connections", guard(self._list)),
                web.post("/api/connections/{name}/disconnect", guard(self._disconnect)),
                web.get("/oauth/connect/{id}", guard(self._connect, page=True))]

    async def _list(self, _request: web.Request) -> web.Response:
        return web.json_response({"connections": [view(c) for c in await self.gateway.connections_of(self.user)]})

    async def _disconnect(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not _NAME.fullmatch(name):
            return web.json_response({"error": "not a connection name"}, status=400)
        return web.json_response({"message": await self.gateway.disconnect(name, self.user, channel=self.channel)})

    async def _connect(self, request: web.Request) -> web.StreamResponse:
        """Mint this person's link and go there (it opens once, binding this browser)."""
        raw = request.match_info["id"]
        if not _ID.fullmatch(raw):
            return web.json_response({"error": "not a request id"}, status=400)
        url = await self.gateway.connect_link(int(raw), self.user, channel=self.channel)
        raise web.HTTPFound(url, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


def view(c: ConnectionView) -> dict[str, Any]:
    return {"name": c.name, "shared": not c.owner, "scopes": list(c.scopes) if c.scopes is not None else None,
            "expires_at": c.expires_at.isoformat() if c.expires_at else None, "refreshable": c.refreshable,
            "connected_by": c.connected_by, "updated_at": c.updated_at.isoformat(), "describe": c.describe()}
