"""A fake PagerDuty REST API (v2): the schedules' on-call users and ``/abilities``, behind ``Token token=…``; it
records every request, and can fail (a status, a redirect, a huge answer) as a test says."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "pd-test-token-0123456789"


@dataclass
class PagerDutyRequest:
    path: str
    query: dict[str, str]
    authorization: str


@dataclass
class FakePagerDuty:
    # schedule id → the e-mail addresses on call now
    on_call: dict[str, list[str]] = field(default_factory=dict)
    requests: list[PagerDutyRequest] = field(default_factory=list)
    status: int | None = None  # every schedule read answers with this status (e.g. 500, 302)
    users: list[dict[str, Any]] | None = None  # answered as is instead of ``on_call`` (a hostile answer)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/schedules/{schedule}/users", self._schedule_users)
        app.router.add_get("/abilities", self._abilities)
        return app

    def reads(self, schedule: str) -> int:
        return sum(1 for r in self.requests if r.path == f"/schedules/{schedule}/users")

    def _authorized(self, request: web.Request) -> bool:
        self.requests.append(PagerDutyRequest(request.path, dict(request.query),
                                              request.headers.get("Authorization", "")))
        return request.headers.get("Authorization") == f"Token token={TOKEN}"

    async def _abilities(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": {"message": "Unauthorized", "code": 2006}}, status=401)
        return web.json_response({"abilities": ["teams"]})

    async def _schedule_users(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": {"message": "Unauthorized", "code": 2006}}, status=401)
        if self.status is not None and 300 <= self.status < 400:
            return web.Response(status=self.status, headers={"Location": "http://evil.invalid/steal"})
        if self.status is not None:
            return web.json_response({"error": {"message": "Internal error"}}, status=self.status)
        if not request.query.get("since") or not request.query.get("until"):
            return web.json_response({"error": {"message": "since and until are required"}}, status=400)
        schedule = request.match_info["schedule"]
        if self.users is not None:
            return web.json_response({"users": self.users})
        if schedule not in self.on_call:
            return web.json_response({"error": {"message": "Not Found", "code": 2100}}, status=404)
        users = [{"id": f"PU{n}", "type": "user", "email": email, "name": email.split("@")[0]}
                 for n, email in enumerate(self.on_call[schedule])]
        return web.json_response({"users": users})
