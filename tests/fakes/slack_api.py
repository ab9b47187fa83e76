"""A fake Slack Web API: answers the methods the bot calls and records every call."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.slack_oauth import BOT_USER_ID, TEAM_ID, FakeSlackOAuth

REFUSED_POST = "chat.postMessage (refused)"  # recorded for each post an outage refused (see FakeSlack.outage)


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    at: float = field(default_factory=time.monotonic)
    token: str = ""  # the bot token it carried (multi-workspace mode: whose workspace it acted in)


@dataclass
class Failure:
    status: int = 200
    error: str | None = None
    retry_after: int | str | None = None  # the Retry-After header, as sent (a str: any text a server may send)
    channel: str | None = None  # only a call to this channel fails (others go through); None: any call


@dataclass
class FakeSlack(FakeSlackOAuth):
    calls: list[Call] = field(default_factory=list)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _ts: int = 0
    _host: str = ""
    groups: dict[str, list[str]] = field(default_factory=dict)  # user group id -> member ids
    channels: dict[str, str] = field(default_factory=lambda: {"ops": "COPS", "general": "CGEN", "acc-dest": "CACC",
                                                              "outside": "COUT"})
    not_member: set[str] = field(default_factory=lambda: {"COUT"})
    # Socket Mode: the WebSocket the bot opened, and the envelope ids it acknowledged.
    socket: web.WebSocketResponse | None = None
    socket_acks: list[str] = field(default_factory=list)
    socket_connected: asyncio.Event = field(default_factory=asyncio.Event)
    _envelopes: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # files_upload_v2: files whose upload URL was handed out (by id), and those completed into a channel.
    _files: dict[str, dict[str, Any]] = field(default_factory=dict)
    uploads: list[dict[str, Any]] = field(default_factory=list)
    # Messages in channels, as conversations.history / conversations.replies return them (with metadata):
    # every post that landed, and any a test adds (e.g. a person's).
    messages: list[dict[str, Any]] = field(default_factory=list)
    # An outage of chat.postMessage (see ``outage``).
    _outage_until: float = 0.0
    _outage_calls: int = 0
    _outage_after: int = 0
    _outage_lands: bool = False
    # conversations.replies/history: at most this many messages a page (with a cursor), like Slack; None: all.
    page_limit: int | None = None
    # chat.postMessage answers only after this long (a slow Slack); the post lands even if the caller gave up.
    post_delay_s: float = 0.0
    # assistant.threads.setStatus works (a workspace with the agent features), or is refused as by one without.
    status_supported: bool = False
    url: str = ""  # where it is served (set by whoever starts it)
    # Files people shared (``share``), by id, and each download asked for: (file id, Authorization header).
    hosted: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    downloads: list[tuple[str, str]] = field(default_factory=list)
    files_readable: bool = True  # False: the app lacks files:read (Slack answers with its sign-in page)
    chunked_files: bool = False  # serve files in pieces, without a Content-Length
    # users.info: display names by user id (an unknown id is a nameless full member of TEAM_ID), and
    # facts that label a sender's trust by user id (e.g. {"is_restricted": True}, {"team_id": "TOTHER"},
    # {"is_bot": True}, {"deleted": True}); ``None`` for an id answers user_not_found.
    names: dict[str, str] = field(default_factory=dict)
    people: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # Channels' members (conversations.members, ``member_page`` a page); a channel not listed has U1 and the bot.
    # Private channels and group DMs (conversations.info says so), archived channels, and pinned (channel, ts).
    members: dict[str, list[str]] = field(default_factory=dict)
    member_page: int = 1000
    private: set[str] = field(default_factory=set)
    mpims: set[str] = field(default_factory=set)
    archived: set[str] = field(default_factory=set)
    pins: list[tuple[str, str]] = field(default_factory=list)
    team_scopes: dict[str, list[str]] = field(default_factory=dict)  # an install's own scopes (else ``scopes``)
    # users.lookupByEmail: user id by e-mail address (the record is users.info's, ``people`` facts included)
    emails: dict[str, str] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/{method}", self._handle)
        app.router.add_get("/api/{method}", self._handle)
        app.router.add_get("/link", self._socket_mode)
        app.router.add_get("/oauth/v2/authorize", self._authorize)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files/{file_id}", self._download)
        return app

    def share(self, file_id: str, content: bytes, *, name: str, mimetype: str,
              size: int | None = None) -> dict[str, Any]:
        """A file people shared: served at its private URL (with the bot token only); its ``event.files`` entry."""
        self.hosted[file_id] = (content, mimetype)
        return {"id": file_id, "name": name, "title": name, "mimetype": mimetype, "filetype": name.rsplit(".")[-1],
                "size": len(content) if size is None else size, "mode": "hosted",
                "url_private": f"{self.url}/files/{file_id}", "url_private_download": f"{self.url}/files/{file_id}"}

    async def _download(self, request: web.Request) -> web.StreamResponse:
        """files.slack.com: the file to a bearer of a bot token, Slack's sign-in page (HTML, 200) to anyone else."""
        self.downloads.append((request.match_info["file_id"], request.headers.get("Authorization", "")))
        if not request.headers.get("Authorization", "").startswith("Bearer xoxb-") or not self.files_readable:
            return web.Response(text="<html>sign in</html>", content_type="text/html")
        if request.match_info["file_id"] == "FREDIRECT":  # a redirect off Slack's host
            raise web.HTTPFound("http://evil.invalid/steal")
        found = self.hosted.get(request.match_info["file_id"])
        if found is None:
            return web.Response(status=404, text="file not found")
        if not self.chunked_files:
            return web.Response(body=found[0], content_type=found[1])
        response = web.StreamResponse(headers={"Content-Type": found[1]})  # no length: chunk after chunk
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(found[0]), 16_384):
            await response.write(found[0][start:start + 16_384])
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    async def push_socket_event(self, body: dict[str, Any]) -> str:
        """Deliver an Events API payload over the Socket Mode connection; returns its envelope id."""
        assert self.socket is not None, "the bot has not opened a Socket Mode connection"
        envelope_id = f"env-{next(self._envelopes)}"
        await self.socket.send_json({"envelope_id": envelope_id, "type": "events_api", "payload": body,
                                     "accepts_response_payload": False, "retry_attempt": 0})
        return envelope_id

    async def wait_for_ack(self, envelope_id: str, timeout: float = 10.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: envelope_id in self.socket_acks), timeout)

    async def _socket_mode(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.socket = ws
        await ws.send_json({"type": "hello", "num_connections": 1,
                            "debug_info": {"host": "fake", "approximate_connection_time": 3600}})
        self.socket_connected.set()
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                data = json.loads(msg.data)
                async with self._changed:
                    if "envelope_id" in data:
                        self.socket_acks.append(data["envelope_id"])
                    self._changed.notify_all()
        return ws

    def fail_next(self, method: str, failure: Failure) -> None:
        self.failures.setdefault(method, []).append(failure)

    def outage(self, *, seconds: float = 0.0, calls: int = 0, after: int = 0, lands: bool = False) -> None:
        """chat.postMessage answers HTTP 503 for ``seconds`` or for ``calls`` calls, starting ``after`` more
        calls went through. ``lands``: the post is stored (and counted) all the same, only its response is
        lost. ``outage()`` ends it."""
        self._outage_until = time.monotonic() + seconds if seconds else 0.0
        self._outage_calls = calls
        self._outage_after = after
        self._outage_lands = lands

    def _in_outage(self) -> bool:
        if self._outage_after > 0:
            self._outage_after -= 1
            return False
        if self._outage_calls > 0:
            self._outage_calls -= 1
            return True
        return time.monotonic() < self._outage_until

    def _message(self, params: dict[str, Any]) -> dict[str, Any] | None:
        return next((m for m in self.messages if m["ts"] == params.get("ts") and m["channel"] == params.get("channel")),
                    None)

    def shown(self, ts: str) -> str:
        """What a message (a post, or a streamed one) shows now: its markdown blocks' text, if it has them."""
        message = next(m for m in self.messages if m["ts"] == ts)
        markdown = [b["text"] for b in message.get("blocks") or [] if b.get("type") == "markdown"]
        if markdown:
            return "\n".join(markdown).replace("<\u200b", "<")
        return str(message.get("markdown_text") or message.get("text") or "")

    def of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def posts(self) -> list[Call]:
        return self.of("chat.postMessage")

    def ephemerals(self, user: str) -> list[str]:
        return [str(c.params.get("text")) for c in self.of("chat.postEphemeral") if c.params.get("user") == user]

    async def wait_for(self, method: str, count: int = 1, timeout: float = 10.0) -> list[Call]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.of(method)) >= count), timeout)
        return self.of(method)

    async def _upload(self, request: web.Request) -> web.Response:
        """Step 2 of files_upload_v2: the bytes go to the URL files.getUploadURLExternal gave."""
        pending = self._files.get(request.match_info["file_id"])
        if pending is None:
            return web.Response(status=404, text="unknown upload")
        pending["content"] = (await request.read()).decode("utf-8", "replace")
        return web.Response(text="OK - uploaded")

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        # slack_sdk sends some methods' arguments as JSON, others as a form or in the query string.
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            params.update(await request.json())
        else:
            params.update(dict(await request.post()))
        if method == "chat.postMessage" and self.post_delay_s:
            await asyncio.shield(asyncio.sleep(self.post_delay_s))
        if method == "chat.postMessage" and self._in_outage():
            async with self._changed:
                if self._outage_lands:
                    self.calls.append(Call(method, params))
                    self._answer(method, params)
                self.calls.append(Call(REFUSED_POST, params))
                self._changed.notify_all()
            return web.Response(status=503, text="upstream connect error")
        pending = self.failures.get(method, [])
        failure = next((f for f in pending if f.channel in (None, params.get("channel"))), None)
        if failure is not None:
            pending.remove(failure)
            headers = {"Retry-After": str(failure.retry_after)} if failure.retry_after is not None else {}
            body = {"ok": False, "error": failure.error or "ratelimited"}
            return web.json_response(body, status=failure.status, headers=headers)
        self._host = request.host
        token = str(params.get("token") or request.headers.get("Authorization", "").removeprefix("Bearer "))
        async with self._changed:
            self.calls.append(Call(method, params, token=token))
            self._changed.notify_all()
        if method == "auth.test" and params.get("token", request.headers.get("Authorization", "")).endswith("bad"):
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if method == "oauth.v2.access":
            return web.json_response(self._oauth_access(request, params))
        if method == "auth.revoke" and token in self.tokens:  # an install refused, or uninstalled
            del self.tokens[token]
            return web.json_response({"ok": True, "revoked": True})
        if token.endswith("-installed") and token not in self.tokens:  # minted here, then revoked
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if method == "auth.test" and token in self.tokens:
            answer = self._answer(method, params) | {"team_id": self.tokens[token]}
            scopes = self.team_scopes.get(self.tokens[token], self.scopes)
            return web.json_response(answer, headers={"x-oauth-scopes": ",".join(scopes)})
        headers = {"x-oauth-scopes": ",".join(self.scopes)} if method == "auth.test" else {}
        answer = self._answer(method, params)
        if method == "users.info" and token in self.tokens and isinstance(answer.get("user"), dict) \
                and params.get("user") not in self.people:
            answer["user"]["team_id"] = self.tokens[token]  # an installed workspace's own people
        return web.json_response(answer, headers=headers)

    def _answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "auth.test":
            return {"ok": True, "url": "https://t1.slack.com/", "team": "Team", "user": "bot",
                    "team_id": TEAM_ID, "user_id": BOT_USER_ID, "bot_id": "BBOT"}
        if method == "apps.connections.open":
            return {"ok": True, "url": f"ws://{self._host}/link"}
        problem = _blocks_problem(params.get("blocks"))
        if problem is not None:
            return {"ok": False, "error": "invalid_blocks", "errors": [problem]}
        if method == "chat.postMessage":
            self._ts += 1
            # Slack's ts is the time of posting (answers are looked for from when they were written on).
            ts = f"{int(time.time())}.{500000 + self._ts:06d}"
            message = {"type": "message", "ts": ts, "text": params.get("text"), "user": BOT_USER_ID, "bot_id": "BBOT"}
            if params.get("metadata"):
                message["metadata"] = params["metadata"]
            if params.get("blocks"):
                message["blocks"] = _decoded(params["blocks"])
            self.messages.append(message | {"channel": params.get("channel"), "thread_ts": params.get("thread_ts")})
            return {"ok": True, "channel": params.get("channel"), "ts": ts, "message": message}
        if method in ("conversations.replies", "conversations.history"):
            # Replies: the thread's messages, oldest first; history: the channel's top-level ones, newest first.
            channel, thread = params.get("channel"), params.get("ts")
            if method == "conversations.replies":
                found = [m for m in self.messages if m["channel"] == channel and thread in (m["thread_ts"], m["ts"])]
            else:
                found = [m for m in reversed(self.messages) if m["channel"] == channel and not m["thread_ts"]]
            if params.get("oldest"):  # only messages after it (at it too, with inclusive)
                oldest, inclusive = float(params["oldest"]), str(params.get("inclusive")).lower() in ("1", "true")
                found = [m for m in found if float(m["ts"]) > oldest or (inclusive and float(m["ts"]) == oldest)]
            cursor = ""
            if self.page_limit is not None:
                start, limit = int(params.get("cursor") or 0), min(int(params.get("limit") or 100), self.page_limit)
                cursor, found = str(start + limit) if start + limit < len(found) else "", found[start:start + limit]
            metadata = str(params.get("include_all_metadata")).lower() in ("1", "true")
            return {"ok": True, "has_more": bool(cursor), "messages": [
                {k: v for k, v in m.items() if k not in ("channel", "thread_ts") and (metadata or k != "metadata")}
                | ({"thread_ts": m["thread_ts"]} if m["thread_ts"] else {}) for m in found],
                "response_metadata": {"next_cursor": cursor}}
        if method in ("reactions.add", "reactions.remove", "chat.postEphemeral", "views.open",
                      "assistant.threads.setSuggestedPrompts", "assistant.threads.setTitle"):
            return {"ok": True}
        if method == "chat.update":
            message = self._message(params)
            if message is not None:
                for key in ("text", "markdown_text", "metadata"):
                    if params.get(key) is not None:
                        message[key] = params[key]
                if params.get("blocks") is not None:  # the blocks replace what was shown
                    message["blocks"] = _decoded(params["blocks"])
                    message.pop("markdown_text", None)
            return {"ok": True, "channel": params.get("channel"), "ts": params.get("ts")}
        if method == "users.info":
            user = str(params.get("user"))
            if user in self.people and self.people[user] is None:
                return {"ok": False, "error": "user_not_found"}
            record: dict[str, Any] = {"id": user, "team_id": TEAM_ID, "profile": {}}
            if user in self.names:
                record.update(name=user.lower(), profile={"display_name": self.names[user]})
            record.update(self.people.get(user) or {})
            return {"ok": True, "user": record}
        if method == "users.lookupByEmail":
            user_id = self.emails.get(str(params.get("email")).lower())
            if user_id is None:
                return {"ok": False, "error": "users_not_found"}
            return self._answer("users.info", {"user": user_id})
        if method == "assistant.threads.setStatus":
            return {"ok": True} if self.status_supported else {"ok": False, "error": "missing_scope"}
        if method == "chat.delete":
            message = self._message(params)
            if message is None:
                return {"ok": False, "error": "message_not_found"}
            self.messages.remove(message)
            return {"ok": True, "channel": params.get("channel"), "ts": params.get("ts")}
        if method == "chat.startStream":
            self._ts += 1
            ts = f"{int(time.time())}.{500000 + self._ts:06d}"
            self.messages.append({"type": "message", "ts": ts, "text": "", "user": BOT_USER_ID, "bot_id": "BBOT",
                                  "markdown_text": params.get("markdown_text") or "", "streaming": True,
                                  "channel": params.get("channel"), "thread_ts": params.get("thread_ts")})
            return {"ok": True, "channel": params.get("channel"), "ts": ts}
        if method in ("chat.appendStream", "chat.stopStream"):
            message = self._message(params)
            if message is None or not message.get("streaming"):
                return {"ok": False, "error": "message_not_in_streaming_state"}
            message["markdown_text"] += params.get("markdown_text") or ""
            if method == "chat.stopStream":
                message["streaming"] = False
                if params.get("metadata"):
                    message["metadata"] = params["metadata"]
                if params.get("blocks"):  # shown under the streamed text
                    message["footer_blocks"] = _decoded(params["blocks"])
            return {"ok": True, "channel": params.get("channel"), "ts": params.get("ts")}
        if method == "files.getUploadURLExternal":
            file_id = f"F{len(self._files) + 1:06d}"
            self._files[file_id] = {"id": file_id, "filename": params.get("filename"), "content": None}
            return {"ok": True, "file_id": file_id, "upload_url": f"http://{self._host}/upload/{file_id}"}
        if method == "files.completeUploadExternal":
            done = []
            for item in json.loads(str(params.get("files") or "[]")):
                pending = self._files.get(str(item.get("id")))
                if pending is None or pending["content"] is None:
                    return {"ok": False, "error": "file_not_found"}
                self.uploads.append(pending | {"title": item.get("title"), "channel": params.get("channel_id"),
                                               "thread_ts": params.get("thread_ts"),
                                               "initial_comment": params.get("initial_comment")})
                done.append({"id": pending["id"], "name": pending["filename"]})
            return {"ok": True, "files": done}
        if method == "usergroups.users.list":
            return {"ok": True, "users": self.groups.get(str(params.get("usergroup")), [])}
        if method == "conversations.info":
            channel = str(params.get("channel"))
            names = {i: n for n, i in self.channels.items()}
            if channel not in names:
                return {"ok": False, "error": "channel_not_found"}
            return {"ok": True, "channel": {"id": channel, "name": names[channel],
                                            "is_member": channel not in self.not_member,
                                            "is_private": channel in self.private or channel in self.mpims,
                                            "is_mpim": channel in self.mpims, "is_general": channel == "CGEN",
                                            "is_archived": channel in self.archived}}
        if method.startswith(("conversations.", "pins.")) and method not in ("conversations.open",
                                                                              "conversations.list"):
            return self._channel_work(method, params)
        if method == "conversations.open":
            return {"ok": True, "channel": {"id": f"D{params.get('users')}"}}
        if method == "conversations.list":
            return {"ok": True, "channels": [{"id": i, "name": n} for n, i in self.channels.items()],
                    "response_metadata": {"next_cursor": ""}}
        return {"ok": False, "error": "unknown_method", "detail": json.dumps(params)[:200]}


    def _channel_work(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Members, and what the Slack tools change: create, invite, archive, set a topic, pin."""
        if method == "conversations.create":
            name = str(params.get("name"))
            if not name or any(not (c.islower() or c.isdigit() or c in "-_") for c in name) or len(name) > 80:
                return {"ok": False, "error": "invalid_name_specials"}
            if name in self.channels:
                return {"ok": False, "error": "name_taken"}
            channel = f"CNEW{len(self.channels) + 1}"
            self.channels[name] = channel
            self.members[channel] = [BOT_USER_ID]
            if str(params.get("is_private")).lower() in ("1", "true"):
                self.private.add(channel)
            return {"ok": True, "channel": {"id": channel, "name": name}}
        channel = str(params.get("channel"))
        if channel not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        members = self.members.setdefault(channel, ["U1", BOT_USER_ID])
        if method == "conversations.members":
            start = int(params.get("cursor") or 0)
            end = start + min(int(params.get("limit") or 100), self.member_page)
            return {"ok": True, "members": members[start:end],
                    "response_metadata": {"next_cursor": str(end) if end < len(members) else ""}}
        if channel in self.not_member:
            return {"ok": False, "error": "not_in_channel"}
        if channel in self.archived:
            return {"ok": False, "error": "already_archived" if method == "conversations.archive" else "is_archived"}
        if method == "conversations.invite":
            users = str(params.get("users")).split(",")
            if BOT_USER_ID in users:
                return {"ok": False, "error": "cant_invite_self"}
            if any(user in members for user in users):
                return {"ok": False, "error": "already_in_channel"}
            members.extend(users)
            return {"ok": True, "channel": {"id": channel}}
        if method == "conversations.archive":
            if channel == "CGEN":
                return {"ok": False, "error": "cant_archive_general"}
            self.archived.add(channel)
            return {"ok": True}
        if method == "conversations.setTopic":
            return {"ok": True, "channel": {"id": channel, "topic": {"value": params.get("topic")}}}
        if method == "pins.add":
            pin = (channel, str(params.get("timestamp")))
            if pin in self.pins:
                return {"ok": False, "error": "already_pinned"}
            self.pins.append(pin)
            return {"ok": True}
        return {"ok": False, "error": "unknown_method"}


_BLOCK_TYPES = {"markdown", "context_actions", "actions", "section", "context", "divider", "header", "rich_text"}


def _decoded(blocks: Any) -> list[dict[str, Any]]:
    """Blocks as sent: a list (JSON body) or a JSON string (a form)."""
    return json.loads(blocks) if isinstance(blocks, str) else list(blocks)


def _blocks_problem(blocks: Any) -> str | None:
    """What Slack would refuse in ``blocks`` (the limits our answers come near)."""
    if blocks is None:
        return None
    items = _decoded(blocks)
    if len(items) > 50:
        return "no more than 50 items allowed"
    markdown = 0
    for block in items:
        if not isinstance(block, dict) or block.get("type") not in _BLOCK_TYPES:
            return f"unknown block type {block.get('type') if isinstance(block, dict) else block!r}"
        if block["type"] == "markdown":
            markdown += len(str(block.get("text") or ""))
            if not block.get("text"):
                return "markdown block without text"
        if block["type"] == "context_actions":
            for element in block.get("elements") or []:
                if element.get("type") not in ("feedback_buttons", "icon_button"):
                    return "context_actions holds only feedback_buttons or icon_button"
    if markdown > 12_000:
        return "markdown blocks exceed 12,000 characters in one message"
    return None
