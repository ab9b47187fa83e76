"""``POST /events/<name>`` (SPEC §17): the body read up to ``EVENT_MAX_BODY_BYTES`` while it arrives (a declared
``Content-Length`` is not trusted, and one over the cap is refused before reading), then handed to
``core.webhooks.intake.WebhookIntake``, which decides the answer. Also: each source's secret, from the
environment (or ``.env``) at start."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from aiohttp import web
from dotenv import dotenv_values

from core.webhooks.intake import WebhookIntake
from core.webhooks.model import EventSource, IntakeAnswer

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
# The whole body, from the handler's start: it is held (up to the cap) before its signature can be checked, so
# a sender that stops short must not keep the memory and the connection for as long as it likes.
BODY_READ_TIMEOUT_S = 30.0


class EventRoutes:
    def __init__(self, intake: WebhookIntake, max_body_bytes: int) -> None:
        self.intake = intake
        self.max_body_bytes = max_body_bytes

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/events/{name}", self._deliver)]

    async def _deliver(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.intake.sources:
            return _closing(await self.intake.deliver(name, request.headers, b""))  # 404, body unread
        if any(coding.strip().lower() not in ("", "identity")
               for header in request.headers.getall("Content-Encoding", []) for coding in header.split(",")):
            # Not inflated here: a small compressed body can grow past any cap before it is counted. Every
            # header, every coding in it: aiohttp would inflate by one the first alone does not name.
            return _closing(IntakeAnswer(400, "compressed bodies are not accepted"))
        declared = request.content_length
        if declared is not None and declared > self.max_body_bytes:
            return _closing(self.intake.too_large(name))  # said at once: not a byte of it read
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT_S):
                body = await self._read(request)
        except TimeoutError:
            return _closing(self.intake.too_slow(name))
        if body is None:
            return _closing(self.intake.too_large(name))
        return _response(await self.intake.deliver(name, request.headers, body))

    async def _read(self, request: web.Request) -> bytes | None:
        """The body, or None once it has proved larger than the cap: at most cap + 1 bytes are read."""
        chunks: list[bytes] = []
        size = 0
        while size <= self.max_body_bytes:
            chunk = await request.content.read(min(READ_CHUNK, self.max_body_bytes + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        return None


def _response(answer: IntakeAnswer) -> web.Response:
    headers = {"Retry-After": str(answer.retry_after_s)} if answer.retry_after_s is not None else None
    return web.Response(status=answer.status, text=answer.text, headers=headers)


def _closing(answer: IntakeAnswer) -> web.Response:
    """An answer before the body was read to its end: the connection is not kept for another request."""
    response = _response(answer)
    response.force_close()
    return response


def secret_values(sources: list[EventSource], env_file: Path | None = Path(".env")) -> dict[str, str]:
    """Each source's secret that is set, by source name: its ``secret_env`` in the environment, else in ``.env``
    (as every setting is read)."""
    dotenv: dict[str, str | None] = dict(dotenv_values(env_file)) if env_file and env_file.exists() else {}
    found = {source.name: os.environ.get(source.secret_env) or str(dotenv.get(source.secret_env) or "")
             for source in sources}
    return {name: secret for name, secret in found.items() if secret}


def event_secrets(sources: list[EventSource], *, env_file: Path | None = Path(".env")) -> dict[str, str]:
    """Each source's secret (``secret_values``). A source without one is said once here; the intake refuses its
    deliveries (401)."""
    secrets = secret_values(sources, env_file)
    for source in sources:
        if source.name not in secrets:
            log.error("event source %s: the environment variable %s (secret_env) is not set: every delivery to "
                      "POST /events/%s is refused (401) until it is", source.name, source.secret_env, source.name)
    return secrets
