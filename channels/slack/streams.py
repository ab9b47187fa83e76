"""Answers streamed into their thread while the model writes (chat.startStream / appendStream / stopStream).

The stream is only a view: the answer itself is stored with the turn's end and delivered exactly once by
core's outbox (``SlackPort.deliver``). That delivery takes the turn's stream over and ends it as the
answer's first part, with the delivery's metadata: the stream's message gets what it still lacks, or, if
what it shows is not how the answer begins (text the model wrote before a tool call, an append whose
answer was lost), the whole part replaces it. A stream that cannot be ended that way, or that began so
long ago that a later look for the answer would not find it (``STALE_S``), is deleted, and the answer is
posted as usual. Further parts of a long answer follow as their own messages.

A stream starts only once the model has been writing for ``start_delay_s``: an answer that comes whole
sooner is posted as one message (one call instead of two). Each stream has one task that starts it and
then sends what was written, at most once per ``append_interval_s``; all streams together keep to Slack's
rate tiers (appendStream Tier 4, about 100 a minute; chat.update Tier 3, about 50). If Slack refuses
streaming (an old workspace, a missing feature), the answer shows as one posted message updated as it
grows. Model text is sent with every ``<`` defused, so it cannot become a mention (``<!channel>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code, transient
from channels.slack.blocks import answer_blocks, feedback_block, stop_block
from channels.slack.formatting import MESSAGE_LIMIT, defused, to_mrkdwn
from channels.slack.payloads import PERSON
from core.model import SessionInfo

log = logging.getLogger(__name__)

START_DELAY_S = 0.3  # a stream starts once the answer has been written for this long (SLACK_STREAM_DELAY_S)
APPEND_INTERVAL_S = 1.0  # one append per stream per second at most: what a reader sees as smooth
APPENDS_PER_MINUTE = 100  # Slack's Tier 4 (appendStream), for all streams of the workspace together
UPDATES_PER_MINUTE = 50  # Tier 3 (chat.update): the fallback's pace
# The stream's message holds the answer's first part (the parts are MESSAGE_LIMIT long; a part is cut at a
# paragraph and may close a code fence): text past this waits for the end, when the parts are known.
STREAM_LIMIT = MESSAGE_LIMIT - 8
# A delivery looks for its earlier attempts among messages posted since 5 minutes before the answer was
# written (SlackPort): a stream older than this at the end is replaced by a fresh post, so it can be found.
STALE_S = 240.0
_TRANSPORT = (aiohttp.ClientError, TimeoutError, OSError)


class _NoRecipient(Exception):
    """A stream would have no Slack person to go to."""


@dataclass
class LiveStream:
    turn_id: int
    channel: str
    thread_ts: str
    team: str | None  # whom the stream is for (Slack wants both when it streams into a channel)
    user: str | None
    mode: str = "new"  # "stream" (Slack's streaming), "update" (the fallback), "off" (nothing shows)
    ts: str | None = None
    started_at: float = 0.0  # time.time() of the start (the message's ts, as Slack gives it)
    shown: str = ""  # what Slack shows now (as written, before defusing)
    pending: str = ""  # written by the model, not sent yet
    last_call: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one call of this stream at a time
    pump: asyncio.Task[None] | None = None
    stalled: bool = False  # a call failed: nothing more is sent, the end replaces the whole text
    done: bool = False  # delivery (or the turn's end) took over: nothing more is sent from here


class _Pacer:
    """Spaces calls of one Slack method across every stream: a slot per ``60 / per_minute`` seconds."""

    def __init__(self, per_minute: int) -> None:
        self._gap = 60.0 / per_minute
        self._next = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        at = max(now, self._next)
        self._next = at + self._gap
        await asyncio.sleep(at - now)


class SlackStreams:
    def __init__(self, client: AsyncWebClient, *, start_delay_s: float = START_DELAY_S,
                 append_interval_s: float = APPEND_INTERVAL_S) -> None:
        self.client = client
        self.start_delay_s = start_delay_s
        self.append_interval_s = append_interval_s
        self._appends = _Pacer(APPENDS_PER_MINUTE)
        self._updates = _Pacer(UPDATES_PER_MINUTE)
        self._streams: dict[int, LiveStream] = {}
        # Turns whose answer went to delivery: late text for them is dropped (a recent window is kept).
        self._closed: dict[int, None] = {}

    # -- the model writes --------------------------------------------------------------------

    def add(self, session: SessionInfo, turn_id: int, sender: str | None, text: str, *, restart: bool) -> None:
        """More of turn ``turn_id``'s answer (already masked). ``restart``: a new model call begins, and
        what it writes follows what was shown after a blank line (the final answer replaces it all)."""
        if turn_id in self._closed:
            return
        stream = self._streams.get(turn_id)
        if stream is None:
            ref = session.reply_ref
            if not ref.get("channel") or not ref.get("thread_ts"):
                return  # a top-level post (a schedule's): nothing to stream into
            team = session.id.split(":")[1] if session.id.count(":") >= 3 else None
            stream = self._streams[turn_id] = LiveStream(turn_id, str(ref["channel"]), str(ref["thread_ts"]), team,
                                                          sender)
        if restart and (stream.shown or stream.pending):
            text = "\n\n" + text.lstrip("\n")
        # Only the first part shows while it is written: what goes past it waits for the end, not in memory.
        stream.pending = (stream.pending + text)[:max(STREAM_LIMIT - len(stream.shown), 0) + 1]
        if stream.pump is None and stream.mode in ("new", "stream", "update") and not stream.stalled \
                and len(stream.shown) < STREAM_LIMIT:
            stream.pump = asyncio.create_task(self._pump(stream), name=f"stream:{turn_id}")

    async def _pump(self, stream: LiveStream) -> None:
        """The stream's one task: starts it after the delay, then sends what is written, paced, until
        nothing more is pending (``add`` starts it again when more comes)."""
        try:
            if stream.mode == "new":
                await asyncio.sleep(self.start_delay_s)  # an answer done sooner is posted whole instead
                async with stream.lock:
                    if stream.done:
                        return
                    await self._start(stream)
            while stream.pending and stream.mode in ("stream", "update") and not (stream.done or stream.stalled) \
                    and len(stream.shown) < STREAM_LIMIT:
                await asyncio.sleep(max(stream.last_call + self._interval(stream) - time.monotonic(), 0.0))
                await (self._appends if stream.mode == "stream" else self._updates).wait()
                async with stream.lock:
                    if stream.done or stream.stalled:
                        return
                    more, stream.pending = _fit(stream, stream.pending)
                    if more:
                        await self._send(stream, more)
        except Exception:  # never lost silently: the end puts the message right
            log.exception("streaming an answer failed")
            stream.stalled = True
        finally:
            stream.pump = None

    def _interval(self, stream: LiveStream) -> float:
        return self.append_interval_s if stream.mode == "stream" else max(self.append_interval_s, 2.0)

    async def _start(self, stream: LiveStream) -> None:
        first, stream.pending = _fit(stream, stream.pending)
        try:
            if stream.user is None or not PERSON.fullmatch(stream.user):
                # Nobody on Slack asked (an event's turn): a stream needs its recipient, so none is started.
                raise _NoRecipient
            response = await self.client.chat_startStream(channel=stream.channel, thread_ts=stream.thread_ts,
                                                         markdown_text=defused(first, piece=True),
                                                         recipient_team_id=stream.team, recipient_user_id=stream.user)
            stream.mode = "stream"
        except (SlackApiError, _NoRecipient) as exc:
            if isinstance(exc, SlackApiError):
                log.info("chat.startStream refused (%s): the answer shows as a message updated as it grows",
                         error_code(exc))
            try:
                response = await self.client.chat_postMessage(channel=stream.channel, thread_ts=stream.thread_ts,
                                                              text=to_mrkdwn(first), blocks=_working(stream, first))
                stream.mode = "update"
            except (SlackApiError, *_TRANSPORT) as again:
                log.warning("could not show the answer as it is written: %s", type(again).__name__)
                stream.mode = "off"
                return
        except _TRANSPORT as exc:
            log.warning("chat.startStream failed: %s", type(exc).__name__)
            stream.mode = "off"  # it may have landed all the same: the end looks at ``ts`` only
            return
        stream.ts, stream.started_at = str(response.get("ts")), time.time()
        stream.shown, stream.last_call = first, time.monotonic()

    async def _send(self, stream: LiveStream, more: str) -> None:
        assert stream.ts is not None
        try:
            if stream.mode == "stream":
                await self.client.chat_appendStream(channel=stream.channel, ts=stream.ts,
                                                    markdown_text=defused(more, piece=True))
            else:
                await self.client.chat_update(channel=stream.channel, ts=stream.ts, text=to_mrkdwn(stream.shown + more),
                                              blocks=_working(stream, stream.shown + more))
        except (SlackApiError, *_TRANSPORT) as exc:
            # It may have landed (an answer lost on the way): what Slack shows is unknown now, so nothing more
            # is appended, and the end replaces the whole text.
            log.warning("streaming the answer failed (%s); it is shown whole at the end",
                        error_code(exc) if isinstance(exc, SlackApiError) else type(exc).__name__)
            stream.stalled = True
            return
        stream.shown += more
        stream.last_call = time.monotonic()

    # -- the answer is delivered -----------------------------------------------------------------

    def take(self, turn_id: int) -> LiveStream | None:
        """Delivery takes the turn's stream over (``None``: none began): nothing more is sent from here,
        and text still coming for the turn is dropped. A call under way finishes first (``finish`` waits)."""
        self._closed[turn_id] = None
        if len(self._closed) > 4096:
            del self._closed[next(iter(self._closed))]
        stream = self._streams.pop(turn_id, None)
        if stream is not None:
            stream.done = True
        return stream

    async def finish(self, stream: LiveStream, head: str, metadata: dict[str, Any], *,
                     feedback_for: int | None = None) -> str | None:
        """End the stream as the answer's first part ``head``, marked with ``metadata`` (and the feedback
        buttons for turn ``feedback_for``): its ts, or None when there is no stream message to end (the
        caller posts ``head`` itself). Raises SlackApiError or a transport error when Slack may take it later
        (delivery retries, with the same stream)."""
        async with stream.lock:
            if stream.ts is None or stream.mode not in ("stream", "update"):
                return None
            if time.time() - stream.started_at > STALE_S:
                await self._delete(stream)
                return None
            if stream.mode == "stream" and not stream.stalled and head.startswith(stream.shown):
                try:
                    await self.client.chat_stopStream(
                        channel=stream.channel, ts=stream.ts, markdown_text=defused(head[len(stream.shown):]) or None,
                        blocks=[feedback_block(feedback_for)] if feedback_for is not None else None, metadata=metadata)
                    return stream.ts
                except SlackApiError as exc:
                    if transient(exc, error_code(exc)):
                        raise
                    # Slack ended it already (e.g. message_not_in_streaming_state): replace it instead.
            elif stream.mode == "stream":
                with contextlib.suppress(SlackApiError, *_TRANSPORT):  # the update below says it all anyway
                    await self.client.chat_stopStream(channel=stream.channel, ts=stream.ts)
            try:
                await self.client.chat_update(channel=stream.channel, ts=stream.ts, text=to_mrkdwn(head),
                                              blocks=answer_blocks(head, feedback_for=feedback_for), metadata=metadata)
                return stream.ts
            except SlackApiError as exc:
                if transient(exc, error_code(exc)):
                    raise
            await self._delete(stream)  # it cannot become the answer: the answer is posted instead
            return None

    async def _delete(self, stream: LiveStream) -> None:
        assert stream.ts is not None
        with contextlib.suppress(SlackApiError, *_TRANSPORT):
            if stream.mode == "stream":
                await self.client.chat_stopStream(channel=stream.channel, ts=stream.ts)
            await self.client.chat_delete(channel=stream.channel, ts=stream.ts)
        stream.mode = "off"

    async def abandon(self, turn_id: int, note: str) -> None:
        """The turn ended without an answer (failed, stopped): its stream ends where it is, with ``note``."""
        stream = self.take(turn_id)
        if stream is None:
            return
        async with stream.lock:
            if stream.ts is None:
                return
            with contextlib.suppress(SlackApiError, *_TRANSPORT):
                if stream.mode == "stream":
                    await self.client.chat_stopStream(channel=stream.channel, ts=stream.ts,
                                                      markdown_text=f"\n\n_{note}_")
                elif stream.mode == "update":
                    text = f"{stream.shown}\n\n_{note}_"
                    await self.client.chat_update(channel=stream.channel, ts=stream.ts, text=to_mrkdwn(text),
                                                  blocks=answer_blocks(text))

    async def close(self) -> None:
        """Shutting down: no more calls (a stream cut off here stays as it was; the answer is posted after
        the restart)."""
        pumps = [s.pump for s in self._streams.values() if s.pump is not None]
        for stream in self._streams.values():
            stream.done = True
        for pump in pumps:
            pump.cancel()
        if pumps:
            await asyncio.wait(pumps)


def _working(stream: LiveStream, text: str) -> list[dict[str, Any]]:
    """The fallback's live message: the answer so far, and a Stop button for the turn writing it."""
    return [*answer_blocks(text), stop_block(stream.turn_id)]


def _fit(stream: LiveStream, text: str) -> tuple[str, str]:
    """What of ``text`` the stream's message can still take (it holds the first part only), and the rest."""
    room = max(STREAM_LIMIT - len(stream.shown), 0)
    return text[:room], text[room:]
