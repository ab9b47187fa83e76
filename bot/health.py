"""Health (the process is up) and readiness (it serves: database reachable, recovered, channels started),
and the middleware that refuses work while the bot starts or stops."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web


class Serving(Protocol):
    """What readiness reads of the application (``bot.app.Application``)."""

    @property
    def phase(self) -> str: ...  # "starting", then "ready", then "stopping"

    async def problems(self) -> list[str]: ...  # why it does not serve now (empty: it does)

    def channel_names(self) -> list[str]: ...


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


_ALWAYS_SERVED = ("/healthz", "/readyz")


def until_ready(app: Serving) -> Any:
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


def readyz_handler(app: Serving) -> Any:
    async def readyz(_request: web.Request) -> web.Response:
        problems = await app.problems()
        if problems:
            return web.json_response({"status": "not ready", "problems": problems}, status=503)
        return web.json_response({"status": "ready", "channels": app.channel_names()})

    return readyz
