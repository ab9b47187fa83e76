"""Where a conversation's posts go in Slack, and the thread that its first post opens.

Most conversations are a thread from their start (a mention's, a DM's). An event's conversation is not: it
is asked for with ``{"channel": C, "open_thread": True}`` and no ``thread_ts``. Its first post, whatever it
is (the answer, a notice, a failure, a card), goes top-level in C, and every later one goes in that post's
thread, in this turn and every later one. Every place that posts for a conversation asks here where.

Where the thread is goes on record through core (``Gateway.thread_opened``, a compare-and-set), so a later
turn, another replica and the next start find it; this process also remembers it, because the conversation
a running turn carries was read before its thread opened. In this process one lock per conversation makes
an answer and a card that race for the first post take turns: one opens the thread, the other follows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from core.gateway import Gateway
from core.model import SessionInfo

log = logging.getLogger(__name__)

OPEN_THREAD = "open_thread"  # a reply reference's flag: the conversation's first post opens its thread
_REMEMBERED = 4096  # conversations whose opened thread this process keeps in mind (the database has them all)
T = TypeVar("T")


def opens_thread(reply_ref: dict[str, Any]) -> bool:
    """Whether a post with this reference opens the conversation's thread (none is open yet)."""
    return bool(reply_ref.get(OPEN_THREAD)) and not reply_ref.get("thread_ts")


def place_of(reply_ref: dict[str, Any]) -> tuple[str, str | None]:
    """(channel, thread ts) of a reference; no thread ts: a top-level post."""
    thread_ts = reply_ref.get("thread_ts")
    return str(reply_ref.get("channel") or ""), (str(thread_ts) if thread_ts else None)


class SessionThreads:
    """Each conversation's reference as it is now, and the post that opens a thread for those that ask for one.
    Without a gateway (a port built alone), a reference is taken as it is given."""

    def __init__(self, gateway: Gateway | None) -> None:
        self.gateway = gateway
        self._opened: OrderedDict[str, dict[str, Any]] = OrderedDict()  # session id → its reference since
        self._locks: dict[str, asyncio.Lock] = {}

    async def reply_ref(self, session: SessionInfo) -> dict[str, Any]:
        """The reference to post with now: the session's own, unless it still waits for its thread, when what
        this process saw opened, else the database (another replica's post, an earlier run's), may know better."""
        ref = session.reply_ref
        if not opens_thread(ref):
            return ref
        known = self._opened.get(session.id)
        if known is not None:
            return known
        if self.gateway is not None:
            stored = await self.gateway.session(session.id)
            if stored is not None and not opens_thread(stored.reply_ref):
                self._remember(session.id, stored.reply_ref)
                return stored.reply_ref
        return ref

    async def place(self, session: SessionInfo) -> tuple[str, str | None]:
        """Where a post that must not open the thread goes (a file, a reminder): the thread, if it is open."""
        return place_of(await self.reply_ref(session))

    async def post(self, session: SessionInfo, send: Callable[[str, str | None], Awaitable[T]],
                   landed: Callable[[T], str | None]) -> T:
        """``send(channel, thread_ts)`` in the session's place. If its thread is not open yet, the post opens it
        (top-level; ``landed`` gives its ts from what ``send`` returned, None: it did not land) and where it is
        goes on record before anything else of this session posts in this process."""
        ref = await self.reply_ref(session)
        if not opens_thread(ref):
            return await send(*place_of(ref))
        lock = self._locks.setdefault(session.id, asyncio.Lock())
        async with lock:
            ref = await self.reply_ref(session)  # opened while this post waited its turn: it follows that one
            if not opens_thread(ref):
                return await send(*place_of(ref))
            result = await send(place_of(ref)[0], None)
            ts = landed(result)
            if ts:
                await self.opened(session, ref, ts)
        if session.id in self._opened and self._locks.get(session.id) is lock:
            del self._locks[session.id]  # later posts find the thread remembered: no lock needed
        return result

    async def opened(self, session: SessionInfo, was: dict[str, Any], ts: str) -> dict[str, Any]:
        """The top-level post ``ts`` opened the session's thread: recorded (unless another post, maybe another
        replica's, opened one first). The reference now in force. Raises what the database raised: a caller
        that goes on posting must not post in a thread nobody will find again."""
        opened = {key: value for key, value in was.items() if key != OPEN_THREAD} | {"thread_ts": ts}
        if self.gateway is not None:
            opened = await self.gateway.thread_opened(session.id, opened, was=was)
            if opened.get("thread_ts") != ts:
                log.warning("conversation %s: another post opened its thread first; this one stays top-level",
                            session.id)
        self._remember(session.id, opened)
        return opened

    def _remember(self, session_id: str, ref: dict[str, Any]) -> None:
        self._opened[session_id] = ref
        self._opened.move_to_end(session_id)
        while len(self._opened) > _REMEMBERED:
            self._opened.popitem(last=False)
