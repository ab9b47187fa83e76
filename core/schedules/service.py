"""Managing schedules (SPEC §9): create one (and win its destination approval), list, pause, resume, cancel.

The ``schedules`` table is the truth. This service changes it and tells this process's jobs
(``core.schedules.jobs``) at once; without them (the operator's CLI) the scheduler of the running
gateway follows the table at its next firing or sync.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from core.approvals import ApprovalBroker
from core.clock import Clock
from core.errors import Conflict, InvalidInput, NotAllowed, NotFound
from core.events import EventBus, Notice
from core.model import ApprovalStatus, ScheduleStatus, SessionInfo
from core.people import Person
from core.ports import Ports
from core.store import ConversationStore
from core.store.schedules import ScheduleStore, recorded_senders
from core.store.tables import ScheduleRow
from core.text import MAX_ID, clean_text
from core.tools import DESTINATION_TOOL
from core.triggers import TriggerSpec
from core.trust import NOT_ALLOWED, SenderTrust, Trust, is_restricted, restricted
from core.views import ScheduleView

log = logging.getLogger(__name__)

class JobControl(Protocol):
    """What management asks of the scheduler in this process (``core.schedules.jobs.ScheduleJobs``)."""

    async def add(self, schedule_id: int, trigger: TriggerSpec) -> None: ...
    async def pause(self, schedule_id: int) -> None: ...
    async def remove(self, schedule_id: int) -> None: ...


class ScheduleService:
    def __init__(self, store: ScheduleStore, conversations: ConversationStore, approvals: ApprovalBroker,
                 bus: EventBus, clock: Clock, *, interval_floor_s: int = 60, jobs: JobControl | None = None,
                 ports: Ports | None = None) -> None:
        self.store = store
        self.conversations = conversations
        self.approvals = approvals
        self.policy = approvals.policy
        self.bus = bus
        self.clock = clock
        self.floor_s = interval_floor_s
        self.jobs = jobs  # None: no scheduler in this process (the CLI)
        self.ports = ports or Ports()  # a destination is resolved by its channel's port
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Go on waiting for the destination approvals of schedules created before a restart."""
        for schedule in await self.store.all(statuses=(ScheduleStatus.PENDING_DESTINATION,)):
            self._spawn(self._await_destination(schedule))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # A fresh context: it outlives the request or turn that started it, and must not act as them.
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- creating -------------------------------------------------------------------------------

    async def create(self, *, prompt: str, trigger: TriggerSpec, destination: str, agent: str, creator: str,
                     origin: SessionInfo, channel: str, trust: str | None = None) -> ScheduleView:
        """Validate everything, store the schedule (pending its destination on ``channel``) and ask for the
        destination approval in ``origin``. Bad input raises InvalidInput and stores nothing. ``trust``: the
        level of the turn asking (a guest's, an outsider's or a bot's request creates nothing: NotAllowed)."""
        levels = self.approvals.policy.trust
        if trust is None and levels is not None:  # a person's own request (a command): their level
            trust = await levels.level(origin.channel, creator, origin.place)
        if await restricted(levels, trust, creator, "create", "schedule", session=origin.id):
            raise NotAllowed(f"creating schedules is {NOT_ALLOWED} ({trust}): a schedule runs on its creator's "
                             "authority, which guests, people from other organisations and bots do not have here")
        prompt = clean_text(prompt)  # stored, then fired as a message: no NUL, no lone surrogate
        if not prompt.strip():
            raise InvalidInput("the prompt is empty")
        trigger.check(self.clock.now(), self.floor_s)
        destination_id = await self.ports.get(channel).resolve_destination(destination)
        # Who had written where it is asked for, read here (never from the model's arguments): its firings act
        # through the creator's personal connections only if nobody else had (core.connections.service).
        writers = await self.store.writers(origin.id)
        await self.conversations.ensure_session(origin, self.clock.now())
        schedule = await self.store.add(ScheduleRow(
            prompt=prompt.strip(), trigger=trigger.to_json(), destination=destination, destination_id=destination_id,
            channel=channel, agent=agent, creator=creator, creator_trust=trust, origin_session=origin.id,
            origin_senders=None if writers is None else json.dumps(list(dict.fromkeys((creator, *writers)))),
            status=ScheduleStatus.PENDING_DESTINATION, created_at=self.clock.now(),
        ))
        self._spawn(self._await_destination(schedule))
        return schedule_view(schedule)

    async def _await_destination(self, schedule: ScheduleRow) -> None:
        assert schedule.id is not None
        approval = await self.approvals.get(schedule.approval_id) if schedule.approval_id else None
        granted = False
        if approval is None:  # a restart between asking and recording the request: find it, don't ask again
            approval = await self.approvals.for_call(schedule.origin_session or "", f"schedule:{schedule.id}")
            if approval is not None:
                await self.store.set_status(schedule.id, ScheduleStatus.PENDING_DESTINATION, approval_id=approval.id,
                                            only_from=(ScheduleStatus.PENDING_DESTINATION,), now=self.clock.now())
        if approval is None:
            args = destination_args(schedule)
            # "Always allow" on an earlier destination approval: this agent may post there again.
            # Whoever had written where it was asked for may have asked for it (core.self_approval).
            senders = recorded_senders(schedule) or ()
            granted = await self.approvals.granted(agent=schedule.agent, tool=DESTINATION_TOOL,
                                                   place=destination_place(schedule), args=args,
                                                   not_by=self.approvals.sole_approvers(schedule.creator, senders))
            if not granted:
                approval = await self.approvals.request(
                    session_id=schedule.origin_session or "", turn_id=None, call_id=f"schedule:{schedule.id}",
                    tool=DESTINATION_TOOL, args=args, agent=schedule.agent, place=destination_place(schedule),
                    requester=schedule.creator, senders=senders,
                )
                await self.store.set_status(schedule.id, ScheduleStatus.PENDING_DESTINATION, approval_id=approval.id,
                                            now=self.clock.now())
        if approval is not None and not approval.settled:
            approval = await self.approvals.wait(approval)
        origin = await self.conversations.get_session(schedule.origin_session or "")
        if granted or (approval is not None and approval.status == ApprovalStatus.APPROVED):
            await self._activate(schedule)
            text = (f"Schedule {schedule.id} is active: {schedule_view(schedule).describe()}, "
                    f"posting to {schedule.destination}"
                    + (" (always allowed there)." if granted else "."))
        else:
            await self.store.set_status(schedule.id, ScheduleStatus.CANCELLED, now=self.clock.now(),
                                        only_from=(ScheduleStatus.PENDING_DESTINATION,))
            text = f"Schedule {schedule.id} was not started: posting to {schedule.destination} was not approved."
        if origin is not None:
            self.bus.emit(Notice(origin, text))

    async def _activate(self, schedule: ScheduleRow, by: str = "system") -> None:
        assert schedule.id is not None
        if not await self.store.set_status(schedule.id, ScheduleStatus.ACTIVE, now=self.clock.now(), by=by,
                                           only_from=(ScheduleStatus.PENDING_DESTINATION, ScheduleStatus.PAUSED)):
            return
        if self.jobs is not None:  # else the running gateway's scheduler adds the job when it syncs
            await self.jobs.add(schedule.id, TriggerSpec.from_json(schedule.trigger))

    # -- managing -------------------------------------------------------------------------------

    async def list(self, *, place: str | None = None, viewer: Person | None = None,
                   trust: str | None = None) -> list[ScheduleView]:
        """Schedules. A ``viewer`` (a person asking somewhere) sees those asked for at ``place`` or posting
        there, unless an admin; without a viewer (an operator, the web chat's own list) every one. ``trust``:
        the level of the turn asking for the viewer (an admin's powers only at the admin level)."""
        rows = await self.store.all()
        if viewer is not None and not self._as_admin(viewer.user, trust, viewer.channel):
            if not place:
                return []
            rows = [r for r in rows if _posts_to(r, place) or await self._origin_place(r) == place]
        return [schedule_view(r) for r in rows]

    async def _origin_place(self, schedule: ScheduleRow) -> str | None:
        origin = await self.conversations.get_session(schedule.origin_session) if schedule.origin_session else None
        return origin.place if origin is not None else None

    async def creator_demoted(self, schedule: ScheduleRow) -> tuple[Trust, Trust] | None:
        levels = self.approvals.policy.trust
        return None if levels is None else await creator_demoted(levels, self.conversations, schedule)

    def may_change(self, schedule: ScheduleView, user: str, trust: str | None = None, *, channel: str) -> bool:
        """Pausing, resuming and cancelling belong to a schedule's creator and to admins (``user`` of
        ``channel``)."""
        return user == schedule.creator or self._as_admin(user, trust, channel)

    async def _may_change(self, schedule: ScheduleRow, user: str, trust: str | None, channel: str) -> bool:
        """``may_change``, the creator compared with their channel too: the channel of the conversation the
        schedule was asked for in (another channel's person with the same id is not its creator)."""
        if self._as_admin(user, trust, channel):
            return True
        if user != schedule.creator:
            return False
        origin = await self.conversations.get_session(schedule.origin_session) if schedule.origin_session else None
        # No origin on record (a schedule older than origins, or its conversation gone): nothing says the
        # creator's channel, so the id alone is compared, as before.
        return origin is None or origin.channel == channel

    def _as_admin(self, user: str, trust: str | None, channel: str) -> bool:
        """Whether ``user`` (of ``channel``) acts with an admin's powers: an admin, in a turn (``trust``: its
        level, None for a person acting directly) that no less-trusted sender's words are part of."""
        return self.policy.is_admin(user, channel=channel) and trust in (None, "admin")

    async def pause_asked_in(self, asked_there: Callable[[str], bool], *, by: str) -> int:
        """Pause every active schedule whose origin session ``asked_there`` (a place its channel can no longer
        reach: its firings would only fail); they can be resumed once it can. How many."""
        paused = 0
        for schedule in await self.store.all(statuses=(ScheduleStatus.ACTIVE,)):
            if schedule.id is not None and schedule.origin_session and asked_there(schedule.origin_session):
                try:
                    await self.change(schedule.id, "pause", by=by, channel=None, operator=True)
                except Conflict:
                    continue  # paused or ended meanwhile
                paused += 1
        return paused

    async def change(self, schedule_id: int, action: str, by: str, *, channel: str | None, operator: bool = False,
                     place: str | None = None, trust: str | None = None) -> str:
        """pause, resume or cancel — by its creator, an admin (``by`` of ``channel``), or an operator (no
        channel's person: ``channel`` None, ``operator`` True). Refused with NotFound,
        NotAllowed (not theirs), Conflict (not in a state for that) or InvalidInput (no such action).
        A person asking at ``place`` is told of another's schedule only if ``list`` shows it there: to
        anyone else it does not exist (ids must not reveal other channels' schedules)."""
        if not 0 < schedule_id <= MAX_ID:  # e.g. the model's schedule_cancel: the database holds no more
            raise NotFound(f"there is no schedule {schedule_id}")
        schedule = await self.store.get(schedule_id)
        if schedule is None:
            raise NotFound(f"there is no schedule {schedule_id}")
        if not operator and is_restricted(trust):  # a guest's, outsider's or bot's words change no schedule
            raise NotAllowed(f"changing schedules is {NOT_ALLOWED} ({trust})")
        if not operator and (channel is None or not await self._may_change(schedule, by, trust, channel)):
            if place is not None and not (_posts_to(schedule, place) or await self._origin_place(schedule) == place):
                raise NotFound(f"there is no schedule {schedule_id}")
            raise NotAllowed(f"only its creator or an admin can {action} schedule {schedule_id}")
        if action == "pause":
            if not await self.store.set_status(schedule_id, ScheduleStatus.PAUSED, only_from=(ScheduleStatus.ACTIVE,),
                                               now=self.clock.now(), by=by):
                raise Conflict(f"schedule {schedule_id} is {schedule.status}, not active")
            if self.jobs is not None:
                await self.jobs.pause(schedule_id)
            return f"Schedule {schedule_id} paused."
        if action == "resume":
            if schedule.status != ScheduleStatus.PAUSED:
                raise Conflict(f"schedule {schedule_id} is {schedule.status}, not paused")
            if (demoted := await self.creator_demoted(schedule)) is not None:
                raise Conflict(f"schedule {schedule_id} runs on its creator's authority, and {schedule.creator} is "
                               f"now {demoted[0]} (it was made at {demoted[1]}); cancel it, or create it again")
            await self._activate(schedule, by)
            return f"Schedule {schedule_id} resumed."
        if action == "cancel":
            live = (ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED, ScheduleStatus.PENDING_DESTINATION)
            if not await self.store.set_status(schedule_id, ScheduleStatus.CANCELLED, only_from=live,
                                               now=self.clock.now(), by=by):
                raise Conflict(f"schedule {schedule_id} is already {schedule.status}")
            if self.jobs is not None:
                await self.jobs.remove(schedule_id)
            return f"Schedule {schedule_id} cancelled."
        raise InvalidInput(f"unknown action {action!r}: pause, resume or cancel")


def schedule_view(row: ScheduleRow) -> ScheduleView:
    assert row.id is not None
    return ScheduleView(id=row.id, prompt=row.prompt, trigger=TriggerSpec.from_json(row.trigger),
                        destination=row.destination, creator=row.creator, status=ScheduleStatus(row.status),
                        firings=row.firings, failures=row.failures, last_outcome=row.last_outcome)


def destination_args(schedule: ScheduleRow) -> dict[str, Any]:
    """What the destination approval shows, and (by ``destination_id`` and ``creator``) what its grant
    is keyed by: another person's schedules to the same channel are asked again."""
    return {"schedule": schedule.id, "destination": schedule.destination, "destination_id": schedule.destination_id,
            "creator": schedule.creator, "personal_connections": personal_connections(schedule),
            "when": schedule_view(schedule).describe(), "prompt": schedule.prompt}


def personal_connections(schedule: ScheduleRow) -> str:
    """Whose personal connections (``owner = "user"``) its firings may act through, as the destination card says:
    the creator's, only if nobody else had written where it was asked for."""
    writers = recorded_senders(schedule)
    others = [who for who in writers or () if who != schedule.creator]
    if writers is not None and not others:
        return f"{schedule.creator}'s own, where a call needs one (nobody else had written where it was asked for)"
    why = (f"{', '.join(others[:5])} had also written where it was asked for" if others
           else "who had written where it was asked for is not recorded")
    return f"none: {why}, so its firings act through nobody's personal account"


async def creator_demoted(levels: SenderTrust, conversations: ConversationStore,
                          schedule: ScheduleRow) -> tuple[Trust, Trust] | None:
    """(level now, level at creation) when the schedule's creator no longer holds the authority it was made
    with (core.trust), told by the channel they asked in; None when they still do."""
    origin = await conversations.get_session(schedule.origin_session) if schedule.origin_session else None
    channel, place = (origin.channel, origin.place) if origin is not None else (schedule.channel,
                                                                                 destination_place(schedule))
    return await levels.demoted(channel, schedule.creator, place, schedule.creator_trust)


def destination_place(schedule: ScheduleRow) -> str:
    """Where a firing lives (its approvals are asked there), e.g. "slack:dest:C2"."""
    return f"{schedule.channel}:dest:{schedule.destination_id}"


def _posts_to(schedule: ScheduleRow, place: str) -> bool:
    """Whether the schedule posts to ``place`` ("slack:T1:C2", or a firing's own "slack:dest:C2")."""
    channel, _, rest = place.partition(":")
    return channel == schedule.channel and rest.rsplit(":", 1)[-1] == schedule.destination_id
