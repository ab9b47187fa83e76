"""The rules of memory (SPEC §17): who may write or forget, what a memory may hold, and how many an agent keeps.

- A turn at a restricted level (guest, external, bot: any such person's words in the conversation), an event's
  turn (its words came over the wire) and a sub-agent cannot write or forget; anyone may recall.
- A memory is 1 to ``text_max_chars`` (2,000) characters. A text that holds a stored secret, in any form the
  redactor masks (as written, base64, hex, percent- or JSON-escaped...) or as a reader takes it in (another case, a
  zero-width character, space or line break inside, full-width letters: ``core.redaction.reading``), is refused
  whole: never masked and kept. One kept before its words became a secret's value is shown masked, or hidden whole
  when only its reading holds the value.
- An agent keeps at most ``max_items``: the oldest unpinned ones make room (core.store.memories).
Every write and forget is audited, with whose turn it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from core.clock import Clock
from core.errors import InvalidInput, NotAllowed, NotFound
from core.model import EVENT_PREFIX
from core.redaction import Redactor
from core.store.memories import Added, Memory, MemoryStore, NewMemory
from core.text import text_problem
from core.trust import SenderTrust, is_restricted

log = logging.getLogger(__name__)

HIDDEN = "[hidden: this memory holds a stored secret's value in some form; forget it]"
TEXT_MAX_CHARS = 2_000
RECALL_MAX = 50  # memories one recall returns at most


@dataclass(frozen=True)
class MemoryLimits:
    max_items: int = 1_000  # MEMORY_MAX_ITEMS, per agent
    pinned_max_chars: int = 4_000  # MEMORY_PINNED_MAX_CHARS: the prompt section, frame and all
    text_max_chars: int = TEXT_MAX_CHARS


@dataclass(frozen=True)
class Writer:
    """Whose turn writes or forgets (a tool call's context, or the memory pass's turn)."""

    agent: str
    sender: str | None
    trust: str | None  # the turn's level (core.trust); None: nobody's words (the operator)
    session_id: str | None = None
    subagent: bool = False

    @property
    def actor(self) -> str:
        return self.sender or "agent"


class MemoryService:
    def __init__(self, store: MemoryStore, clock: Clock, *, limits: MemoryLimits = MemoryLimits(),
                 redactor: Redactor | None = None, trust: SenderTrust | None = None) -> None:
        self.store = store
        self.clock = clock
        self.limits = limits
        self.redactor = redactor
        self.trust = trust  # audits a refusal by trust level
        self.generation = 0  # counts this process's changes: what is cached of the memories is stale when it moves

    async def check_writer(self, writer: Writer, action: str) -> None:
        """NotAllowed when ``writer``'s turn may not ``action`` ("write", "forget") memories."""
        if writer.subagent:
            raise NotAllowed("a sub-agent cannot write or forget memories")
        if writer.sender is not None and writer.sender.startswith(EVENT_PREFIX):
            raise NotAllowed("a turn an event started cannot write or forget memories: its words came from outside")
        if is_restricted(writer.trust):
            if self.trust is not None:
                await self.trust.refused(writer.actor, str(writer.trust), f"{action} a memory", "memory",
                                         session=writer.session_id)
            raise NotAllowed("this conversation holds words of a guest, someone outside the organisation or a bot, "
                             "so no memory can be written or forgotten in it")

    async def check_text(self, text: str) -> str:
        """``text`` as it is stored (surrounding blanks removed), or InvalidInput saying why it cannot be."""
        text = text.strip()
        if not text:
            raise InvalidInput("a memory needs some text")
        problem = text_problem(text)
        if problem is not None:
            raise InvalidInput(f"a memory cannot hold {problem}")
        if len(text) > self.limits.text_max_chars:
            raise InvalidInput(f"a memory holds at most {self.limits.text_max_chars:,} characters and this text has "
                               f"{len(text):,}: shorten it")
        if self.redactor is not None:
            await self.redactor.check()  # a secret stored a moment ago (the CLI, another replica) counts
            if await self.redactor.holds_secret(text):
                raise InvalidInput("the text holds the value of a stored secret (in some form): a memory never keeps "
                                   "one, so nothing was saved; name the credential instead of its value")
        return text

    async def remember(self, writer: Writer, text: str, *, pinned: bool = False) -> Added:
        return await self._add(writer, text, pinned=pinned, proposed=False)

    async def propose(self, writer: Writer, text: str) -> Added:
        """A memory the memory pass proposes from ``writer``'s turn: unpinned, marked proposed, checked as any."""
        return await self._add(writer, text, pinned=False, proposed=True)

    async def _add(self, writer: Writer, text: str, *, pinned: bool, proposed: bool) -> Added:
        await self.check_writer(writer, "write")
        kept = await self.check_text(text)
        added = await self.store.add(
            NewMemory(agent=writer.agent, text=kept, pinned=pinned, proposed=proposed, written_by=writer.sender,
                      session_id=writer.session_id),
            max_items=self.limits.max_items, now=self.clock.now(), actor=writer.actor)
        self.generation += 1  # any add may push out another memory: the cached pinned ones are read again
        return added

    async def forget(self, writer: Writer, memory_id: int) -> Memory:
        await self.check_writer(writer, "forget")
        gone = await self.store.forget(memory_id, agent=writer.agent, now=self.clock.now(), actor=writer.actor)
        self.generation += 1
        if gone is None:  # another agent's is not there either, as far as this one can tell
            raise NotFound(f"there is no memory #{memory_id} (recall shows the ids)")
        return gone

    async def forget_as_operator(self, memory_id: int, by: str) -> Memory:
        """``bot memory forget``: any agent's memory (audited under ``by``)."""
        gone = await self.store.forget(memory_id, agent=None, now=self.clock.now(), actor=by)
        self.generation += 1
        if gone is None:
            raise NotFound(f"there is no memory {memory_id}")
        return gone

    async def recall(self, agent: str, query: str, *, limit: int = 10) -> list[Memory]:
        return await self.store.search(agent, query, limit=max(1, min(limit, RECALL_MAX)))

    async def pinned(self, agent: str, *, limit: int = 200) -> list[Memory]:
        return await self.store.pinned(agent, limit=limit)

    async def mask(self, text: str) -> str:
        """``text`` (a memory as shown) with every stored secret masked: a memory kept before its words became a
        stored secret's value shows the mask, in the prompt and to people; one that holds a value only as a reader
        takes it in (``core.redaction.reading``) is hidden whole (no mask could say where the value is)."""
        if self.redactor is None:
            return text
        masked = await self.redactor.redact(text)
        return HIDDEN if self.redactor.reads_as_secret(masked) else masked

    @property
    def masks_version(self) -> int:
        """Changes whenever the masks do (``Redactor.version``): what was masked before is stale."""
        return self.redactor.version if self.redactor is not None else 0

    async def shown(self, memory: Memory) -> Memory:
        """``memory`` as the model and people are shown it (``mask``)."""
        return replace(memory, text=await self.mask(memory.text))
