"""What core calls on Slack (``core.ports.ChannelPort``): deliver answers exactly once, resolve places and groups."""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code, transient
from channels.slack.blocks import answer_blocks
from channels.slack.files import FILE_HOSTS, fetch_shared_file
from channels.slack.formatting import split_message, to_mrkdwn
from channels.slack.people import SlackPeople
from channels.slack.scopes import TokenScopes
from channels.slack.streams import LiveStream, SlackStreams
from channels.slack.threads import SessionThreads, opens_thread, place_of
from channels.slack.workspaces import (
    NOT_INSTALLED,
    TOKEN_GONE,
    WorkspaceClient,
    current_team,
    in_workspace,
    served_team,
    session_team,
    team_of,
)
from core.errors import DeliveryFailed, InvalidInput, ToolError
from core.model import SessionInfo
from core.ports import DeliveryId, Receipt

log = logging.getLogger(__name__)

# Slack's refusals of a message's blocks (not of the message): the answer goes again as text.
BLOCKS_REFUSED = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_blocks_too_long", "invalid_arguments"})
DELIVERY_EVENT = "bot_delivery"  # the message metadata type that marks an answer's chunks
GROUP_CACHE_S = 60.0  # approvers are checked on every click: a group's members are looked up once a minute
CHANNEL_NAMES_S = 300.0  # #names are listed again this often: a renamed channel's name stops meaning it
_LOOKUP_PAGES = 10  # how many messages a retry reads looking for an earlier attempt's chunks (200 a page)
# A retry reads only messages posted since the answer was written, less this: Slack refuses request signatures
# 5 minutes off, so a working bot's clock is within that of Slack's.
_CLOCK_MARGIN_S = 300.0


class SlackPort:
    name = "slack"

    def __init__(self, client: AsyncWebClient, streams: SlackStreams | None = None,
                 file_hosts: frozenset[str] = FILE_HOSTS, threads: SessionThreads | None = None) -> None:
        self.client = client
        self.threads = threads or SessionThreads(None)  # where each conversation's posts go (channels.slack.threads)
        self.file_hosts = file_hosts  # where shared files may be fetched from, with the bot token
        self.streams = streams  # answers shown while they are written (channels.slack.streams)
        self._unfinished: dict[int, LiveStream] = {}  # turn id → its stream, not yet ended: the retry's
        # Caches are per workspace (the key "" in single-workspace mode, where no call names one).
        self._groups: dict[tuple[str, str], tuple[float, set[str]]] = {}
        self.people = SlackPeople(client)  # users.info, cached: names and trust labels
        self.scopes = TokenScopes(client)  # what the token may do: which Slack tools are offered
        self._channel_ids: dict[str, tuple[float, dict[str, str]]] = {}  # workspace → (when listed, name → id)
        self._identity: dict[str, tuple[str, str]] = {}  # (bot_id, bot user id) from auth.test
        self._team: str | None = None  # the installation's team, from the same auth.test
        # What find_delivered just saw of an incomplete delivery, so the resumed deliver needs no second look.
        self._seen: dict[DeliveryId, dict[int, str]] = {}

    async def sender_trust(self, sender: str, place: str | None) -> str | None:
        """A label from Slack's facts about ``sender``, relative to the installation's team: the workspace of
        ``place``, else the one auth.test names (a schedule's destination place carries none). Looked up when
        a turn or a decision needs it, never on the ack path. None: unknown (core counts it as a guest)."""
        team = team_of(place) or served_team()
        if team is None:
            if isinstance(self.client, WorkspaceClient):
                # Several workspaces and none named (a firing's destination place): relative to whose? The
                # clicker's own workspace would call its people members. Unknown (core: a guest); admins still are.
                return None
            await self.identity()  # a failure here is an unknown label (core: a guest), never more trust
            team = self._team
        with in_workspace(team):
            label = None if team is None else await self.people.trust(sender, team)
        if label == "member" and isinstance(self.client, WorkspaceClient) and self.client.allowed is None:
            # Several workspaces and no SLACK_ALLOWED_TEAMS: any workspace may have installed the bot, and
            # nobody chose to trust its people.
            return "guest"
        return label

    def forget(self, team: str) -> None:
        """Drop what was cached of workspace ``team`` (re-installed or removed)."""
        self._identity.pop(team, None)
        self._channel_ids.pop(team, None)
        for key in [key for key in self._groups if key[0] == team]:
            del self._groups[key]
        self.people.forget(team)
        self.scopes.forget(team)

    # -- answers --------------------------------------------------------------------------------

    async def deliver(self, session: SessionInfo, text: str, *, delivery_id: DeliveryId,
                      resume: bool = False) -> Receipt:
        """Post the answer (split under Slack's limits); each chunk carries the delivery id, the session and
        its index as message metadata, so a retry (``resume``) posts only the chunks that did not land. A
        turn that streamed its answer ends that stream as the first chunk (this process's streams only)."""
        with in_workspace(session_team(session.id, session.reply_ref)):
            return await self._deliver(session, text, delivery_id=delivery_id, resume=resume)

    async def _deliver(self, session: SessionInfo, text: str, *, delivery_id: DeliveryId, resume: bool) -> Receipt:
        ref = await self.threads.reply_ref(session)
        channel, thread_ts = _place(session, ref)
        chunks = split_message(text)  # Markdown: a stream shows it as it is, a post converts it to mrkdwn
        stream = self._stream_of(delivery_id.turn_id)
        landed = self._seen.pop(delivery_id, None) if resume else {}
        if landed is None:
            landed = (await self._landed(channel, thread_ts, session, delivery_id))[0]
        if 0 in landed and opens_thread(ref):  # an earlier attempt's first chunk opened the thread: on record now
            channel, thread_ts = _place(session, await self.threads.opened(session, ref, landed[0]))
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
            if index == 0 and thread_ts is None:
                # The first chunk may open the conversation's thread (or follow a card that just did): the
                # others go in it, and only once it is on record, so a retry finds them there.
                landed[0] = await self._opening(session, chunk, metadata, feedback_for)
                channel, thread_ts = _place(session, await self.threads.reply_ref(session))
                continue
            landed[index] = await self._post_part(channel, thread_ts, chunk, metadata, feedback_for)
        return Receipt(landed[0])

    async def _opening(self, session: SessionInfo, chunk: str, metadata: dict[str, Any],
                       feedback_for: int | None) -> str:
        async def send(channel: str, thread_ts: str | None) -> str:
            return await self._post_part(channel, thread_ts, chunk, metadata, feedback_for)

        # Posted, but the database failed while recording the thread: the error ends this attempt before any
        # other chunk is posted, and the retry finds this one and records it (core retries what an adapter raises).
        return await self.threads.post(session, send, lambda ts: ts)

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
        ref = await self.threads.reply_ref(session)
        channel, thread_ts = _place(session, ref)
        with in_workspace(session_team(session.id, session.reply_ref)):
            landed, total = await self._landed(channel, thread_ts, session, delivery_id)
        if 0 in landed and opens_thread(ref):
            # Its first chunk opened the thread before a crash could record it; the others are only ever posted
            # once it is on record, so there are none to look for in it.
            await self.threads.opened(session, ref, landed[0])
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
        """(bot_id, bot user id) in the workspace in scope, asked once: which messages are the bot's own."""
        scope = current_team() or ""
        known = self._identity.get(scope)
        if known is None:
            response = await self._call("auth_test")
            bot_id, user = response.get("bot_id"), response.get("user_id")
            if not bot_id or not user:
                raise DeliveryFailed("auth.test did not name the bot", retryable=True)
            team = response.get("team_id")
            if not scope:
                self._team = str(team) if team else None
            known = self._identity[scope] = (str(bot_id), str(user))
        return known

    async def post_notice(self, session: SessionInfo, text: str) -> bool:
        _place(session, session.reply_ref)  # no channel: DeliveryFailed, as for an answer
        with in_workspace(session_team(session.id, session.reply_ref)):
            return await self.post_for(session, f":information_source: {text}") is not None

    async def post_for(self, session: SessionInfo, text: str) -> str | None:
        """Post in the conversation's place (best effort, as ``post``); its first post opens its thread, if it
        asks for one (``channels.slack.threads``)."""
        async def send(channel: str, thread_ts: str | None) -> str | None:
            return await self.post(channel, thread_ts, text)

        try:
            return await self.threads.post(session, send, lambda ts: ts)
        except Exception as exc:  # the database, while recording the thread: the post itself was made
            log.error("conversation %s: could not record the thread its post opened: %s", session.id,
                      type(exc).__name__)
            return None

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
            failed = _failed(exc)
            if isinstance(self.client, WorkspaceClient) and failed.error in TOKEN_GONE - {NOT_INSTALLED}:
                # Several workspaces: a token replaced by a re-install (through another replica) is dropped by
                # the client, and the retry takes the new one; an uninstall ends the retries (not_installed).
                failed = DeliveryFailed(failed.error, retryable=True, retry_after_s=failed.retry_after_s)
            raise failed from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DeliveryFailed(f"cannot reach Slack ({type(exc).__name__})", retryable=True) from None

    # -- shared files -----------------------------------------------------------------------------

    async def fetch_file(self, source: str, max_bytes: int) -> bytes:
        return await fetch_shared_file(self.client, source, max_bytes, self.file_hosts)

    # -- places and people ----------------------------------------------------------------------

    async def resolve_destination(self, destination: str) -> str:
        """A schedule's destination: the channel id, if the bot can post there (else InvalidInput)."""
        try:
            channel_id = await self.channel_id(destination)
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
        key = (current_team() or "", group_id)
        cached = self._groups.get(key)
        if cached is not None and time.monotonic() - cached[0] < GROUP_CACHE_S:
            return cached[1]
        try:
            response = await self.client.usergroups_users_list(usergroup=group_id)
            users = set(response.get("users") or [])
        except SlackApiError as exc:
            log.warning("usergroups.users.list %s failed: %s", group_id, error_code(exc))
            users = set()
        self._groups[key] = (time.monotonic(), users)
        return users

    async def person_by_email(self, email: str) -> str | None:
        """``core.oncall.EmailDirectory``: the Slack user with this e-mail address (on-call approvers)."""
        return await self.people.by_email(email)

    async def send_message(self, channel: str, text: str) -> str:
        """``message_send``: post to ``#name`` or a channel id; errors become tool errors the model reads.
        It never carries delivery metadata: the model cannot make a post look like a delivered answer."""
        channel_id = await self.channel_id(channel)
        try:
            response = await self.client.chat_postMessage(channel=channel_id, text=text)
        except SlackApiError as exc:
            error = error_code(exc)
            hint = {"not_in_channel": "invite the bot to that channel first",
                    "channel_not_found": "no such channel", "is_archived": "that channel is archived"}
            raise ToolError(f"Slack refused the message to {channel}: {hint.get(error, error)}") from None
        return f"posted to {channel} (ts {response.get('ts')})"

    async def channel_id(self, channel: str, *, fresh: bool = False) -> str:
        """The id of ``#name`` (any channel the bot can see, looked up again when a name is not known yet, and
        every CHANNEL_NAMES_S: channels are renamed) or of a channel id as given; ToolError when there is none.
        ``fresh``: listed now (a call a person approves acts on the channel its card named, just looked up)."""
        if not channel.startswith("#"):
            if re.fullmatch(r"[CGD][A-Z0-9]{2,}", channel):
                return channel
            raise ToolError(f"{channel!r} is not a channel: use #name or a channel id such as C0123ABCD")
        name = channel[1:].lower()
        team = current_team() or ""
        listed, known = self._channel_ids.get(team) or (0.0, {})
        if fresh or name not in known or time.monotonic() - listed >= CHANNEL_NAMES_S:
            started, known, cursor = time.monotonic(), {}, None
            while True:
                response = await self.client.conversations_list(
                    types="public_channel,private_channel", exclude_archived=True, limit=1000, cursor=cursor)
                for item in response.get("channels") or []:
                    known[str(item.get("name"))] = str(item.get("id"))
                cursor = (response.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
            self._channel_ids[team] = (started, known)  # whole lists only: a failed one leaves the last
        if name not in known:
            raise ToolError(f"there is no channel {channel} that the bot can see")
        return known[name]


def _failed(exc: SlackApiError) -> DeliveryFailed:
    """Slack's refusal as a delivery failure: retryable unless Slack said "never"."""
    code = error_code(exc)
    retry_after = _seconds((getattr(exc.response, "headers", None) or {}).get("Retry-After"))
    return DeliveryFailed(code, retryable=transient(exc, code), retry_after_s=retry_after)


def _place(session: SessionInfo, ref: dict[str, Any]) -> tuple[str, str | None]:
    """(channel, thread ts) of the session's reference as it is now (``SessionThreads.reply_ref``)."""
    channel, thread_ts = place_of(ref)
    if not channel:
        raise DeliveryFailed(f"session {session.id} has no Slack channel to answer in", retryable=False)
    return channel, thread_ts


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
