"""Health (the process is up) and readiness (it serves: database reachable, recovered, channels started),
and the middleware that refuses work while the bot starts or stops."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from bot.app import Application


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


_ALWAYS_SERVED = ("/healthz", "/readyz")


def until_ready(app: Application) -> Any:
    """While starting (recovery) and stopping, nothing is taken in: 503, which Slack answers by
    delivering the event again later (to this process once ready, or the next one)."""

    @web.middleware
    async def until_ready(request: web.Request, handler: Any) -> web.StreamResponse:
        if app.phase == "ready" or request.path in _ALWAYS_SERVED:
            response: web.StreamResponse = await handler(request)
            return response
        return web.json_response({"error": f"the bot is {app.phase}; try again in a moment"}, status=503,
                                 headers={"Retry-After": "2"})

    return until_ready


def readyz_handler(app: Application) -> Any:
    async def readyz(_request: web.Request) -> web.Response:
        problems: list[str] = []
        try:
            await app.db.ping()
        except Exception as exc:
            problems.append(f"database: {type(exc).__name__}")
        if app.phase != "ready":
            problems.append(f"the bot is {app.phase}")
        problems += [f"channel {c.name} not started" for c in app.channels if not c.started]
        if not app.dispatcher.accepting:
            problems.append("gateway not accepting")
        if problems:
            return web.json_response({"status": "not ready", "problems": problems}, status=503)
        return web.json_response({"status": "ready", "channels": [c.name for c in app.channels]})

    return readyz
