"""A fake OpenAI-compatible chat-completions server with a script of replies."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)


@dataclass
class HttpError:
    status: int
    message: str = "error"
    retry_after: float | None = None
    code: str | None = None


@dataclass
class Gate:
    """Hold the next request until the test opens the gate (then answer with ``then``)."""

    then: Reply | HttpError
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    reached: asyncio.Event = field(default_factory=asyncio.Event)


Step = Reply | HttpError | Gate


@dataclass
class FakeLLM:
    script: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    delay_s: float = 0.0  # every answer waits this long (benchmarks: a slow model)
    arrivals: list[float] = field(default_factory=list)  # time.perf_counter() of each request
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization", "").endswith("bad-key"):
            return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def then(self, *steps: Step) -> None:
        self.script.extend(steps)

    def last_user_text(self, request_index: int = -1) -> str:
        msgs = [m for m in self.requests[request_index]["messages"] if m["role"] == "user"]
        return str(msgs[-1]["content"]) if msgs else ""

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.arrivals.append(time.perf_counter())
        self.requests.append(body)
        step: Step = self.script.pop(0) if self.script else Reply(text=self._echo(body))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if isinstance(step, Gate):
            step.reached.set()
            await step.opened.wait()
            step = step.then
        if isinstance(step, HttpError):
            headers = {"retry-after": str(step.retry_after)} if step.retry_after is not None else {}
            error = {"error": {"message": step.message, "type": "error", "code": step.code}}
            return web.json_response(error, status=step.status, headers=headers)
        return web.json_response(self._completion(body, step))

    @staticmethod
    def _echo(body: dict[str, Any]) -> str:
        users = [m for m in body["messages"] if m["role"] == "user"]
        return f"echo: {users[-1]['content']}" if users else "echo"

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{next(self._ids)}", "type": "function",
                 "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for name, args in reply.tool_calls
            ]
        return {
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
