"""Scheduled sessions (SPEC §9): APScheduler fires prompts whose answers post to approved destinations.

The ``schedules`` table is the truth (status, destination, tally); APScheduler's job store, on the
same database, only holds the triggers. A job's only argument is the schedule id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from apscheduler.jobstores.base import JobLookupError

from core.approvals import DESTINATION_TOOL, ApprovalBroker, ApprovalPolicy
from core.clock import Clock
from core.dispatcher import Dispatcher
from core.errors import InvalidInput
from core.events import DirectNotice, EventBus, Notice
from core.model import ApprovalStatus, Inbound, MessageRef, SessionInfo
from core.scheduler_backend import DbFriendlyScheduler, build_scheduler
from core.store import ConversationStore, Database, LeaseStore
from core.store.schedules import ScheduleStore
from core.store.tables import ScheduleRow
from core.text import MAX_ID, clean_text
from core.triggers import TriggerSpec

log = logging.getLogger(__name__)

LEADER_LEASE = "scheduler"
# Resolves "#name" or an id to the channel's own id; raises InvalidInput if unknown or out of reach.
DestinationResolver = Callable[[str], Awaitable[str]]


class Status:
    PENDING_DESTINATION = "pending_destination"
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    DONE = "done"


_service: ScheduleService | None = None


async def run_schedule(schedule_id: int) -> None:
    """The job function APScheduler stores by reference; its one argument is the schedule id."""
    if _service is None:
        log.error("schedule %s fired before the schedule service started", schedule_id)
        return
    await _service.fire(schedule_id)


class ScheduleService:
    def __init__(
        self, db: Database, store: ScheduleStore, conversations: ConversationStore, dispatcher: Dispatcher,
        approvals: ApprovalBroker, policy: ApprovalPolicy, bus: EventBus, clock: Clock, *,
        interval_floor_s: int = 60, misfire_grace_min: float = 5, delivery_wait_s: float = 30,
        sync_every_s: float = 5, leases: LeaseStore | None = None, holder: str = "", lease_ttl_s: float = 30,
    ) -> None:
        self.sync_every_s = sync_every_s
        self.leases = leases
        self.holder = holder
        self.lease_ttl_s = lease_ttl_s
        self.db = db
        self.store = store
        self.conversations = conversations
        self.dispatcher = dispatcher
        self.approvals = approvals
        self.policy = policy
        self.bus = bus
        self.clock = clock
        self.floor_s = interval_floor_s
        self.misfire_grace_s = int(misfire_grace_min * 60)
        self.delivery_wait_s = delivery_wait_s
        self.destinations: dict[str, DestinationResolver] = {}
        self._scheduler: DbFriendlyScheduler | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        global _service
        _service = self
        if self.leases is None:
            await self._start_scheduler()
        else:  # several replicas: only the lease holder runs APScheduler (it must not share a job store)
            self._spawn(self._lead())
        for schedule in await self.store.all(statuses=(Status.PENDING_DESTINATION,)):
            self._spawn(self._await_destination(schedule))
        for firing in await self.store.unfinished_firings():
            assert firing.id is not None
            self._spawn(self._finish_recovered(firing.id, firing.session_id, firing.schedule_id))
        self._spawn(self._follow_table())

    async def _follow_table(self) -> None:
        """Pick up changes made outside this process (an operator's resume) every few seconds."""
        while True:
            await asyncio.sleep(self.sync_every_s)
            try:
                await self.sync_jobs()
            except Exception:
                log.exception("could not sync schedules with the scheduler")

    async def _start_scheduler(self) -> None:
        self._scheduler = build_scheduler(self.db, misfire_grace_s=self.misfire_grace_s)
        async with self.db.exclusive():
            self._scheduler.start()

    def _stop_scheduler(self) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduler = None

    async def _lead(self) -> None:
        assert self.leases is not None
        ttl = timedelta(seconds=self.lease_ttl_s)
        while True:
            try:
                held = await self.leases.acquire(LEADER_LEASE, self.holder, ttl, self.clock.now())
            except Exception:
                log.exception("could not reach the scheduler lease")
                held = False
            if held and self._scheduler is None:
                log.info("this replica now runs the scheduler")
                await self._start_scheduler()
            elif not held and self._scheduler is not None:
                log.warning("lost the scheduler lease; another replica runs the schedules now")
                self._stop_scheduler()
            await asyncio.sleep(self.lease_ttl_s / 3)

    @property
    def leading(self) -> bool:
        return self._scheduler is not None

    async def stop(self) -> None:
        global _service
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._stop_scheduler()
        if self.leases is not None:
            await self.leases.release(LEADER_LEASE, self.holder)
        _service = None

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- creating -------------------------------------------------------------------------------

    async def create(self, *, prompt: str, trigger: TriggerSpec, destination: str, agent: str, creator: str,
                     origin: SessionInfo, channel: str = "slack") -> ScheduleRow:
        """Validate everything, store the schedule (pending its destination) and ask for the destination
        approval in ``origin``. Bad input raises InvalidInput and stores nothing."""
        prompt = clean_text(prompt)  # stored, then fired as a message: no NUL, no lone surrogate
        if not prompt.strip():
            raise InvalidInput("the prompt is empty")
        trigger.check(self.clock.now(), self.floor_s)
        resolver = self.destinations.get(channel)
        if resolver is None:
            raise InvalidInput(f"no {channel} channel is configured to deliver to {destination}")
        destination_id = await resolver(destination)
        await self.conversations.ensure_session(origin, self.clock.now())
        schedule = await self.store.add(ScheduleRow(
            prompt=prompt.strip(), trigger=trigger.to_json(), destination=destination, destination_id=destination_id,
            channel=channel, agent=agent, creator=creator, origin_session=origin.id,
            status=Status.PENDING_DESTINATION, created_at=self.clock.now(),
        ))
        self._spawn(self._await_destination(schedule))
        return schedule

    async def _await_destination(self, schedule: ScheduleRow) -> None:
        assert schedule.id is not None
        approval = await self.approvals.get(schedule.approval_id) if schedule.approval_id else None
        granted = False
        if approval is None:
            args = _destination_args(schedule)
            # "Always allow" on an earlier destination approval: this agent may post there again.
            granted = await self.approvals.granted(agent=schedule.agent, tool=DESTINATION_TOOL,
                                                   place=_place(schedule), args=args)
            if not granted:
                approval = await self.approvals.request(
                    session_id=schedule.origin_session or "", turn_id=None, call_id=f"schedule:{schedule.id}",
                    tool=DESTINATION_TOOL, args=args, agent=schedule.agent, place=_place(schedule),
                    requester=schedule.creator,
                )
                await self.store.set_status(schedule.id, Status.PENDING_DESTINATION, approval_id=approval.id)
        if approval is not None and not approval.settled:
            approval = await self.approvals.wait(approval)
        origin = await self.conversations.get_session(schedule.origin_session or "")
        if granted or (approval is not None and approval.status == ApprovalStatus.APPROVED):
            await self._activate(schedule)
            text = (f"Schedule {schedule.id} is active: {TriggerSpec.from_json(schedule.trigger).describe()}, "
                    f"posting to {schedule.destination}"
                    + (" (always allowed there)." if granted else "."))
        else:
            await self.store.set_status(schedule.id, Status.CANCELLED, only_from=(Status.PENDING_DESTINATION,))
            text = f"Schedule {schedule.id} was not started: posting to {schedule.destination} was not approved."
        if origin is not None:
            self.bus.emit(Notice(origin, text))

    async def _activate(self, schedule: ScheduleRow) -> None:
        assert schedule.id is not None
        trigger = TriggerSpec.from_json(schedule.trigger)
        if not await self.store.set_status(schedule.id, Status.ACTIVE,
                                           only_from=(Status.PENDING_DESTINATION, Status.PAUSED)):
            return
        if self._scheduler is None:  # not the leader: the leader adds the job when it syncs with the table
            return
        async with self.db.exclusive():
            self._scheduler.add_job(run_schedule, trigger.build(self.clock.now() - timedelta(days=1), 0),
                                    args=[schedule.id], id=_job_id(schedule.id), replace_existing=True,
                                    coalesce=True, max_instances=1, misfire_grace_time=self.misfire_grace_s)
        log.info("schedule %s active (%s)", schedule.id, trigger.describe())

    # -- firing ---------------------------------------------------------------------------------

    async def fire(self, schedule_id: int) -> None:
        schedule = await self.store.get(schedule_id)
        if schedule is None or schedule.status != Status.ACTIVE:
            if schedule is None or schedule.status in (Status.CANCELLED, Status.DONE):
                await self._remove_job(schedule_id)
            return  # paused (e.g. from another process): skip this one
        trigger = TriggerSpec.from_json(schedule.trigger)
        firing = await self.store.start_firing(schedule_id, self.clock.now(), trigger.min_gap_s())
        if firing is None:
            log.info("schedule %s: skipped a second firing for the same slot", schedule_id)
            return
        assert firing.id is not None
        log.info("schedule %s firing %s", schedule_id, firing.n)
        session = SessionInfo(
            id=firing.session_id, channel=schedule.channel, agent=schedule.agent, status="idle",
            reply_ref={"channel": schedule.destination_id},  # no thread: the answer is a top-level post
            place=_place(schedule),
            preapproved=(("message_send", schedule.destination), ("message_send", schedule.destination_id)),
        )
        accepted = await self.dispatcher.accept(Inbound(
            session_id=session.id, channel=session.channel, sender=schedule.creator, text=schedule.prompt,
            addressed=True, reply_ref=session.reply_ref, ref=MessageRef(), idempotency_key=f"firing:{firing.id}",
            agent=schedule.agent, place=session.place, preapproved=session.preapproved,
        ), internal=True)
        await self._finish(firing.id, firing.session_id, accepted.input_id, schedule, trigger)

    async def _finish_recovered(self, firing_id: int, session_id: str, schedule_id: int) -> None:
        schedule = await self.store.get(schedule_id)
        if schedule is not None:
            input_id = await self.store.firing_input(session_id)
            await self._finish(firing_id, session_id, input_id, schedule, TriggerSpec.from_json(schedule.trigger))

    async def _finish(self, firing_id: int, session_id: str, input_id: int | None, schedule: ScheduleRow,
                      trigger: TriggerSpec) -> None:
        """Wait for the firing's answer and its delivery; record the outcome (verified, not assumed)."""
        ts: str | None = None
        error: str | None = "the firing was not accepted"
        if input_id is not None:
            outcome = await self.dispatcher.outcome(input_id)
            if outcome.status != "answered":
                error = f"{outcome.status}: {outcome.text}"
            else:
                ts, error = await self._delivery(session_id)
        retire = trigger.at is not None
        updated = await self.store.finish_firing(firing_id, ts=ts, error=error, now=self.clock.now(), retire=retire)
        if retire:
            await self._remove_job(updated.id or 0)
        if error:
            log.warning("schedule %s firing failed: %s", schedule.id, error)
        if updated.failures == 2:  # told once, when it starts failing for real
            self.bus.emit(DirectNotice(_dm_session(schedule), schedule.creator,
                                       f"Your schedule {schedule.id} ({trigger.describe()} to {schedule.destination}) "
                                       f"failed twice in a row; last error: {error}"))

    async def _delivery(self, session_id: str) -> tuple[str | None, str | None]:
        turn_id = await self.store.firing_turn(session_id)
        if turn_id is None:
            return None, "no turn ran"
        deadline = self.clock.now() + timedelta(seconds=self.delivery_wait_s)
        while self.clock.now() < deadline:
            ref, error, reported = await self.conversations.delivery(turn_id)
            if reported:
                return ref, error
            await asyncio.sleep(0.05)
        return None, "the channel did not confirm delivery"

    # -- managing -------------------------------------------------------------------------------

    async def list(self, *, place: str | None = None, viewer: str | None = None) -> list[ScheduleRow]:
        """Schedules. A ``viewer`` (a person asking somewhere) sees those asked for at ``place`` or posting
        there, unless an admin; without a viewer (an operator, the web chat's own list) every one."""
        rows = await self.store.all()
        if viewer is None or self.policy.is_admin(viewer):
            return rows
        if not place:
            return []
        return [r for r in rows if _posts_to(r, place) or await self._origin_place(r) == place]

    async def _origin_place(self, schedule: ScheduleRow) -> str | None:
        origin = await self.conversations.get_session(schedule.origin_session) if schedule.origin_session else None
        return origin.place if origin is not None else None

    def may_change(self, schedule: ScheduleRow, user: str) -> bool:
        """Pausing, resuming and cancelling belong to a schedule's creator and to admins."""
        return user == schedule.creator or self.policy.is_admin(user)

    async def change(self, schedule_id: int, action: str, by: str, *, operator: bool = False) -> str:
        """pause, resume or cancel — by its creator, an admin, or an operator."""
        if not 0 < schedule_id <= MAX_ID:  # e.g. the model's schedule_cancel: the database holds no more
            raise InvalidInput(f"there is no schedule {schedule_id}")
        schedule = await self.store.get(schedule_id)
        if schedule is None:
            raise InvalidInput(f"there is no schedule {schedule_id}")
        if not operator and not self.may_change(schedule, by):
            raise InvalidInput(f"only its creator or an admin can {action} schedule {schedule_id}")
        if action == "pause":
            if not await self.store.set_status(schedule_id, Status.PAUSED, only_from=(Status.ACTIVE,)):
                raise InvalidInput(f"schedule {schedule_id} is {schedule.status}, not active")
            await self._pause_job(schedule_id)
            return f"Schedule {schedule_id} paused."
        if action == "resume":
            if schedule.status != Status.PAUSED:
                raise InvalidInput(f"schedule {schedule_id} is {schedule.status}, not paused")
            await self._activate(schedule)  # without a scheduler here (the CLI), the leader syncs it in
            return f"Schedule {schedule_id} resumed."
        if action == "cancel":
            if not await self.store.set_status(schedule_id, Status.CANCELLED,
                                               only_from=(Status.ACTIVE, Status.PAUSED, Status.PENDING_DESTINATION)):
                raise InvalidInput(f"schedule {schedule_id} is already {schedule.status}")
            await self._remove_job(schedule_id)
            return f"Schedule {schedule_id} cancelled."
        raise InvalidInput(f"unknown action {action!r}: pause, resume or cancel")

    async def sync_jobs(self) -> None:
        """Make APScheduler agree with the table (e.g. after a resume made by the CLI)."""
        if self._scheduler is None:
            return
        for schedule in await self.store.all(statuses=(Status.ACTIVE,)):
            assert schedule.id is not None
            job = self._scheduler.get_job(_job_id(schedule.id))
            if job is None or job.next_run_time is None:
                await self.store.set_status(schedule.id, Status.PAUSED, only_from=(Status.ACTIVE,))
                await self._activate(schedule)

    async def _pause_job(self, schedule_id: int) -> None:
        if self._scheduler is not None:
            async with self.db.exclusive():
                try:
                    self._scheduler.pause_job(_job_id(schedule_id))
                except JobLookupError:
                    pass

    async def _remove_job(self, schedule_id: int) -> None:
        if self._scheduler is not None:
            async with self.db.exclusive():
                try:
                    self._scheduler.remove_job(_job_id(schedule_id))
                except JobLookupError:
                    pass

    def next_run(self, schedule_id: int) -> datetime | None:
        job = self._scheduler.get_job(_job_id(schedule_id)) if self._scheduler is not None else None
        return job.next_run_time if job is not None else None


def _destination_args(schedule: ScheduleRow) -> dict[str, Any]:
    """What the destination approval shows, and (by ``destination_id`` and ``creator``) what its grant
    is keyed by: another person's schedules to the same channel are asked again."""
    return {"schedule": schedule.id, "destination": schedule.destination, "destination_id": schedule.destination_id,
            "creator": schedule.creator, "when": TriggerSpec.from_json(schedule.trigger).describe(),
            "prompt": schedule.prompt}


def _job_id(schedule_id: int) -> str:
    return f"schedule:{schedule_id}"


def _place(schedule: ScheduleRow) -> str:
    return f"{schedule.channel}:dest:{schedule.destination_id}"


def _posts_to(schedule: ScheduleRow, place: str) -> bool:
    """Whether the schedule posts to ``place`` ("slack:T1:C2", or a firing's own "slack:dest:C2")."""
    channel, _, rest = place.partition(":")
    return channel == schedule.channel and rest.rsplit(":", 1)[-1] == schedule.destination_id


def _dm_session(schedule: ScheduleRow) -> SessionInfo:
    return SessionInfo(id=f"dm:{schedule.channel}:{schedule.creator}", channel=schedule.channel, agent=schedule.agent,
                       status="idle", reply_ref={"user": schedule.creator})
