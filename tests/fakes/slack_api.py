"""A fake Slack Web API: answers the methods the bot calls and records every call."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BOT_USER_ID = "UBOT"
TEAM_ID = "T1"


@dataclass
class Call:
    method: str
    params: dict[str, Any]


@dataclass
class Failure:
    status: int = 200
    error: str | None = None
    retry_after: int | None = None


@dataclass
class FakeSlack:
    calls: list[Call] = field(default_factory=list)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _ts: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/{method}", self._handle)
        return app

    def fail_next(self, method: str, failure: Failure) -> None:
        self.failures.setdefault(method, []).append(failure)

    def of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def posts(self) -> list[Call]:
        return self.of("chat.postMessage")

    async def wait_for(self, method: str, count: int = 1, timeout: float = 10.0) -> list[Call]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.of(method)) >= count), timeout)
        return self.of(method)

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        # slack_sdk sends some methods' arguments as JSON, others as a form or in the query string.
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            params.update(await request.json())
        else:
            params.update(dict(await request.post()))
        pending = self.failures.get(method)
        if pending:
            failure = pending.pop(0)
            headers = {"Retry-After": str(failure.retry_after)} if failure.retry_after is not None else {}
            body = {"ok": False, "error": failure.error or "ratelimited"}
            return web.json_response(body, status=failure.status, headers=headers)
        async with self._changed:
            self.calls.append(Call(method, params))
            self._changed.notify_all()
        return web.json_response(self._answer(method, params))

    def _answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "auth.test":
            return {"ok": True, "url": "https://t1.slack.com/", "team": "Team", "user": "bot",
                    "team_id": TEAM_ID, "user_id": BOT_USER_ID, "bot_id": "BBOT"}
        if method == "chat.postMessage":
            self._ts += 1
            return {"ok": True, "channel": params.get("channel"), "ts": f"1700000000.{self._ts:06d}",
                    "message": {"text": params.get("text")}}
        if method in ("reactions.add", "reactions.remove", "chat.update", "chat.postEphemeral"):
            return {"ok": True}
        return {"ok": False, "error": "unknown_method", "detail": json.dumps(params)[:200]}
