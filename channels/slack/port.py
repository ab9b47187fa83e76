"""What core calls on Slack (``core.ports.ChannelPort``): deliver answers exactly once, resolve places and groups."""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

import aiohttp
import yarl
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code, transient
from channels.slack.blocks import answer_blocks
from channels.slack.formatting import split_message, to_mrkdwn
from channels.slack.people import SlackPeople, team_of
from channels.slack.streams import LiveStream, SlackStreams
from core.errors import InvalidInput
from core.model import SessionInfo
from core.ports import DeliveryFailed, DeliveryId, FetchFailed, FileTooBig, Receipt
from core.tools import ToolError

log = logging.getLogger(__name__)

FILE_HOSTS = frozenset({"files.slack.com"})  # where shared files live (url_private_download)
_FILE_TIMEOUT = aiohttp.ClientTimeout(total=30.0)
# Slack's refusals of a message's blocks (not of the message): the answer goes again as text.
BLOCKS_REFUSED = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_blocks_too_long", "invalid_arguments"})
DELIVERY_EVENT = "bot_delivery"  # the message metadata type that marks an answer's chunks
GROUP_CACHE_S = 60.0  # approvers are checked on every click: a group's members are looked up once a minute
_LOOKUP_PAGES = 10  # how many messages a retry reads looking for an earlier attempt's chunks (200 a page)
# A retry reads only messages posted since the answer was written, less this: Slack refuses request signatures
# 5 minutes off, so a working bot's clock is within that of Slack's.
_CLOCK_MARGIN_S = 300.0


class SlackPort:
    name = "slack"

    def __init__(self, client: AsyncWebClient, streams: SlackStreams | None = None,
                 file_hosts: frozenset[str] = FILE_HOSTS) -> None:
        self.client = client
        self.file_hosts = file_hosts  # where shared files may be fetched from, with the bot token
        self.streams = streams  # answers shown while they are written (channels.slack.streams)
        self._unfinished: dict[int, LiveStream] = {}  # turn id → its stream, not yet ended: the retry's
        self._groups: dict[str, tuple[float, set[str]]] = {}
        self.people = SlackPeople(client)  # users.info, cached: names and trust labels
        self._channel_ids: dict[str, str] = {}
        self._identity: tuple[str, str] | None = None  # (bot_id, bot user id) from auth.test
        self._team: str | None = None  # the installation's team, from the same auth.test
        # What find_delivered just saw of an incomplete delivery, so the resumed deliver needs no second look.
        self._seen: dict[DeliveryId, dict[int, str]] = {}

    async def sender_trust(self, sender: str, place: str | None) -> str | None:
        """A label from Slack's facts about ``sender``, relative to the installation's team: the workspace of
        ``place``, else the one auth.test names (a schedule's destination place carries none). Looked up when
        a turn or a decision needs it, never on the ack path. None: unknown (core counts it as a guest)."""
        team = team_of(place)
        if team is None:
            await self.identity()  # a failure here is an unknown label (core: a guest), never more trust
            team = self._team
        return None if team is None else await self.people.trust(sender, team)

    # -- answers --------------------------------------------------------------------------------

    async def deliver(self, session: SessionInfo, text: str, *, delivery_id: DeliveryId,
                      resume: bool = False) -> Receipt:
        """Post the answer (split under Slack's limits); each chunk carries the delivery id, the session and
        its index as message metadata, so a retry (``resume``) posts only the chunks that did not land. A
        turn that streamed its answer ends that stream as the first chunk (this process's streams only)."""
        channel, thread_ts = _place(session)
        chunks = split_message(text)  # Markdown: a stream shows it as it is, a post converts it to mrkdwn
        stream = self._stream_of(delivery_id.turn_id)
        landed = self._seen.pop(delivery_id, None) if resume else {}
        if landed is None:
            landed = (await self._landed(channel, thread_ts, session, delivery_id))[0]
        for index, chunk in enumerate(chunks):
            if index in landed:
                continue
            metadata = {"event_type": DELIVERY_EVENT,
                        "event_payload": {"delivery_id": delivery_id.turn_id, "install": delivery_id.install,
                                          "session": session.id, "chunk": index, "chunks": len(chunks)}}
            # The answer's last part carries the feedback buttons.
            feedback_for = delivery_id.turn_id if index == len(chunks) - 1 else None
            if index == 0 and stream is not None:
                ts = await self._finish_stream(delivery_id.turn_id, stream, chunk, metadata, feedback_for)
                if ts is not None:
                    landed[index] = ts
                    continue
            landed[index] = await self._post_part(channel, thread_ts, chunk, metadata, feedback_for)
        return Receipt(landed[0])

    async def _post_part(self, channel: str, thread_ts: str | None, chunk: str, metadata: dict[str, Any],
                         feedback_for: int | None) -> str:
        """One part of the answer as blocks; as plain text where Slack refuses the blocks (an old workspace, a
        block type it does not know): the answer is never lost for its formatting."""
        text = to_mrkdwn(chunk)
        try:
            response = await self._call("chat_postMessage", channel=channel, thread_ts=thread_ts, text=text,
                                        blocks=answer_blocks(chunk, feedback_for=feedback_for), metadata=metadata)
        except DeliveryFailed as exc:
            if exc.error not in BLOCKS_REFUSED:
                raise
            log.warning("Slack refused the answer's blocks (%s): posted as text", exc.error)
            response = await self._call("chat_postMessage", channel=channel, thread_ts=thread_ts, text=text,
                                        metadata=metadata)
        return str(response.get("ts"))

    def _stream_of(self, turn_id: int) -> LiveStream | None:
        """The turn's stream, if its answer showed while it was written: one an earlier attempt could not
        end yet, or else the one the streams hand over (on whichever attempt comes first)."""
        if self.streams is None:
            return None
        return self._unfinished.pop(turn_id, None) or self.streams.take(turn_id)

    async def _finish_stream(self, turn_id: int, stream: LiveStream, head: str, metadata: dict[str, Any],
                             feedback_for: int | None) -> str | None:
        assert self.streams is not None
        # Kept until it is ended: an attempt cut off here (an error, or the delivery's deadline) leaves it to
        # the retry, which ends this same message rather than post another.
        self._unfinished[turn_id] = stream
        if len(self._unfinished) > 1024:
            del self._unfinished[next(iter(self._unfinished))]
        try:
            ts = await self.streams.finish(stream, head, metadata, feedback_for=feedback_for)
        except SlackApiError as exc:
            raise _failed(exc) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DeliveryFailed(f"cannot reach Slack ({type(exc).__name__})", retryable=True) from None
        self._unfinished.pop(turn_id, None)
        return ts

    async def find_delivered(self, session: SessionInfo, delivery_id: DeliveryId) -> Receipt | None:
        """The receipt of an earlier attempt whose every chunk landed (its response may have been lost)."""
        channel, thread_ts = _place(session)
        landed, total = await self._landed(channel, thread_ts, session, delivery_id)
        if total and 0 in landed and len(landed) >= total:
            return Receipt(landed[0])
        self._seen[delivery_id] = landed
        return None

    async def _landed(self, channel: str, thread_ts: str | None, session: SessionInfo,
                      delivery_id: DeliveryId) -> tuple[dict[int, str], int]:
        """Chunks of ``delivery_id`` the bot itself posted here: {index: ts}, and how many there are in all.
        Only the bot's own messages count: metadata anyone else wrote proves nothing. Only messages since the
        answer was written are read (however long the thread); if even those are too many to read, whether
        it landed is unknown: DeliveryFailed (retryable), never "not posted"."""
        bot_id, bot_user = await self.identity()
        oldest = delivery_id.written_at.timestamp() - _CLOCK_MARGIN_S
        since = {"oldest": f"{oldest:.6f}", "inclusive": True}
        landed: dict[int, str] = {}
        total = 0
        cursor: str | None = None
        for _page in range(_LOOKUP_PAGES):
            try:
                if thread_ts is not None:
                    response = await self._call("conversations_replies", channel=channel, ts=thread_ts, limit=200,
                                                include_all_metadata=True, cursor=cursor, **since)
                else:  # a top-level post (a firing's destination): the newest messages come first
                    response = await self._call("conversations_history", channel=channel, limit=200,
                                                include_all_metadata=True, cursor=cursor, **since)
            except DeliveryFailed as exc:
                if exc.retryable:
                    raise
                # E.g. missing_scope: an answer posted twice beats one never posted (a post that cannot
                # go through will say so itself).
                log.warning("cannot look for an earlier post of delivery %s in %s (%s): posting it again",
                            delivery_id.turn_id, channel, exc.error)
                return landed, total
            for message in response.get("messages") or []:
                chunk = _chunk_of(message, session, delivery_id, oldest)
                if chunk is None or message.get("bot_id") != bot_id or message.get("user") not in (None, bot_user):
                    continue
                landed.setdefault(chunk[0], str(message.get("ts")))
                total = chunk[1]
            cursor = (response.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return landed, total
        if total and len(landed) >= total:
            return landed, total  # every chunk found: what was not read cannot change that
        raise DeliveryFailed(f"too many messages in {channel} since the answer was written to tell whether it "
                             "was posted", retryable=True)

    async def identity(self) -> tuple[str, str]:
        """(bot_id, bot user id), asked once: which messages in a thread are the bot's own."""
        if self._identity is None:
            response = await self._call("auth_test")
            bot_id, user = response.get("bot_id"), response.get("user_id")
            if not bot_id or not user:
                raise DeliveryFailed("auth.test did not name the bot", retryable=True)
            team = response.get("team_id")
            self._team = str(team) if team else None
            self._identity = (str(bot_id), str(user))
        return self._identity

    async def post_notice(self, session: SessionInfo, text: str) -> bool:
        channel, thread_ts = _place(session)
        return await self.post(channel, thread_ts, f":information_source: {text}") is not None

    async def post(self, channel: str, thread_ts: str | None, text: str) -> str | None:
        """Post a message (best effort): its ts, or None when Slack refused (logged)."""
        try:
            response = await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)
        except SlackApiError as exc:
            log.error("chat.postMessage to %s failed: %s", channel, error_code(exc))
            return None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.error("chat.postMessage to %s failed: %s", channel, type(exc).__name__)
            return None
        return str(response.get("ts"))

    async def _call(self, method: str, **params: Any) -> Any:
        """A Web API call whose failure becomes DeliveryFailed (retryable unless Slack said "never")."""
        try:
            return await getattr(self.client, method)(**params)
        except SlackApiError as exc:
            raise _failed(exc) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DeliveryFailed(f"cannot reach Slack ({type(exc).__name__})", retryable=True) from None

    # -- shared files -----------------------------------------------------------------------------

    async def fetch_file(self, source: str, max_bytes: int) -> bytes:
        """A shared file's bytes, fetched with the bot token (``files:read``) from Slack's own file host only:
        the token never goes anywhere else, also not through a redirect. Raises FetchFailed (FileTooBig past
        ``max_bytes``: no more than that is ever read) with the reason."""
        if not source:
            raise FetchFailed("Slack did not share its content with the bot")
        url = source
        for _hop in range(3):
            if not _file_url_ok(url, self.file_hosts):
                raise FetchFailed("it is not on Slack's file host")
            session = self.client.session
            if session is None:
                raise FetchFailed("the bot is not connected to Slack right now")
            try:
                # identity: the size limit counts what arrives, and nothing is inflated past it.
                headers = {"Authorization": f"Bearer {self.client.token}", "Accept-Encoding": "identity"}
                async with session.get(url, headers=headers, allow_redirects=False, timeout=_FILE_TIMEOUT) as resp:
                    if resp.status in (301, 302, 303, 307, 308):
                        url = _redirect(resp)
                        continue
                    if resp.status != 200:
                        raise FetchFailed(f"Slack answered HTTP {resp.status}")
                    if resp.content_type == "text/html":  # Slack's sign-in page: the app lacks files:read
                        raise FetchFailed("Slack did not hand it over (the app may lack the files:read scope)")
                    if resp.content_length is not None and resp.content_length > max_bytes:
                        raise FileTooBig(max_bytes)
                    content = bytearray()
                    async for piece in resp.content.iter_chunked(65_536):
                        content += piece
                        if len(content) > max_bytes:
                            raise FileTooBig(max_bytes)
                    return bytes(content)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise FetchFailed(f"Slack could not be reached ({type(exc).__name__})") from None
        raise FetchFailed("Slack redirected too often")

    # -- places and people ----------------------------------------------------------------------

    async def resolve_destination(self, destination: str) -> str:
        """A schedule's destination: the channel id, if the bot can post there (else InvalidInput)."""
        try:
            channel_id = await self._channel_id(destination)
        except ToolError as exc:
            raise InvalidInput(str(exc)) from None
        if channel_id.startswith("D"):
            return channel_id
        try:
            info = await self.client.conversations_info(channel=channel_id)
        except SlackApiError as exc:
            raise InvalidInput(f"cannot post to {destination}: {error_code(exc)}") from None
        if (info.get("channel") or {}).get("is_member") is False:
            raise InvalidInput(f"the bot is not in {destination}: invite it there first (/invite @bot)")
        return channel_id

    async def group_members(self, group_id: str) -> set[str]:
        """Members of a Slack user group (cached for a minute)."""
        cached = self._groups.get(group_id)
        if cached is not None and time.monotonic() - cached[0] < GROUP_CACHE_S:
            return cached[1]
        try:
            response = await self.client.usergroups_users_list(usergroup=group_id)
            users = set(response.get("users") or [])
        except SlackApiError as exc:
            log.warning("usergroups.users.list %s failed: %s", group_id, error_code(exc))
            users = set()
        self._groups[group_id] = (time.monotonic(), users)
        return users

    async def send_message(self, channel: str, text: str) -> str:
        """``message_send``: post to ``#name`` or a channel id; errors become tool errors the model reads.
        It never carries delivery metadata: the model cannot make a post look like a delivered answer."""
        channel_id = await self._channel_id(channel)
        try:
            response = await self.client.chat_postMessage(channel=channel_id, text=text)
        except SlackApiError as exc:
            error = error_code(exc)
            hint = {"not_in_channel": "invite the bot to that channel first",
                    "channel_not_found": "no such channel", "is_archived": "that channel is archived"}
            raise ToolError(f"Slack refused the message to {channel}: {hint.get(error, error)}") from None
        return f"posted to {channel} (ts {response.get('ts')})"

    async def _channel_id(self, channel: str) -> str:
        if not channel.startswith("#"):
            if re.fullmatch(r"[CGD][A-Z0-9]{2,}", channel):
                return channel
            raise ToolError(f"{channel!r} is not a channel: use #name or a channel id such as C0123ABCD")
        name = channel[1:].lower()
        if name not in self._channel_ids:
            cursor = None
            while True:
                response = await self.client.conversations_list(
                    types="public_channel,private_channel", exclude_archived=True, limit=1000, cursor=cursor)
                for item in response.get("channels") or []:
                    self._channel_ids[str(item.get("name"))] = str(item.get("id"))
                cursor = (response.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
        if name not in self._channel_ids:
            raise ToolError(f"there is no channel {channel} that the bot can see")
        return self._channel_ids[name]


def _redirect(resp: aiohttp.ClientResponse) -> str:
    """Where a redirect points (checked like the first URL before anything is sent there)."""
    location = resp.headers.get("Location")
    try:
        if not location:
            raise ValueError("no Location")
        return str(resp.url.join(yarl.URL(location)))
    except ValueError:
        raise FetchFailed("Slack redirected it nowhere usable") from None


def _file_url_ok(url: str, hosts: frozenset[str]) -> bool:
    """Whether the bot token may go to ``url``: https on one of Slack's file hosts (or exactly the configured
    API host, for a test Slack or a proxy in front of it)."""
    try:
        parsed = yarl.URL(url)
    except ValueError:
        return False
    if parsed.user or parsed.password or not parsed.host:
        return False
    authority = f"{parsed.host}:{parsed.explicit_port}" if parsed.explicit_port else parsed.host
    if parsed.path.startswith("/api/"):  # the Web API itself (a configured host serves both): never a file
        return False
    if parsed.scheme == "https" and parsed.host in hosts and parsed.explicit_port in (None, 443):
        # Slack's file host serves shared files under /files-pri/ only.
        return parsed.host != "files.slack.com" or parsed.path.startswith("/files-pri/")
    return authority in hosts and parsed.scheme in ("http", "https") and ":" in authority


def _failed(exc: SlackApiError) -> DeliveryFailed:
    """Slack's refusal as a delivery failure: retryable unless Slack said "never"."""
    code = error_code(exc)
    retry_after = _seconds((getattr(exc.response, "headers", None) or {}).get("Retry-After"))
    return DeliveryFailed(code, retryable=transient(exc, code), retry_after_s=retry_after)


def _place(session: SessionInfo) -> tuple[str, str | None]:
    ref = session.reply_ref
    channel = ref.get("channel")
    if not channel:
        raise DeliveryFailed(f"session {session.id} has no Slack channel to answer in", retryable=False)
    return str(channel), (str(ref["thread_ts"]) if ref.get("thread_ts") else None)


def _chunk_of(message: dict[str, Any], session: SessionInfo, delivery_id: DeliveryId,
              oldest: float) -> tuple[int, int] | None:
    """(chunk index, chunk count) if ``message`` carries this delivery's metadata: this database's turn, this
    session, posted since the answer was written (checked here too, whatever the server did with ``oldest``)."""
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("event_type") != DELIVERY_EVENT:
        return None
    payload, ts = metadata.get("event_payload"), _seconds(message.get("ts"))
    if not isinstance(payload, dict) or ts is None or ts < oldest:
        return None
    if payload.get("install") != delivery_id.install or payload.get("session") != session.id:
        return None
    delivered, chunk, chunks = payload.get("delivery_id"), payload.get("chunk"), payload.get("chunks")
    if type(delivered) is not int or delivered != delivery_id.turn_id or type(chunk) is not int \
            or type(chunks) is not int:
        return None
    return (chunk, chunks) if 0 <= chunk < chunks else None


def _seconds(value: object) -> float | None:
    """A number of seconds as a header (Retry-After) or a ts gives it, if it is one: finite and not negative
    (an HTTP date, "inf", "nan" or "-5" are not)."""
    try:
        seconds = float(str(value))
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
