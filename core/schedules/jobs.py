"""Firing schedules (SPEC §9): APScheduler's jobs, the scheduler lease, and the one job entry point.

The jobs follow the ``schedules`` table; ``run_schedule`` fires one and records how its answer landed.

A job's only argument is the schedule id; the ``schedules`` table says everything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from apscheduler.jobstores.base import JobLookupError

from core.clock import Clock
from core.delivery import Deliveries
from core.dispatcher import Dispatcher
from core.errors import InvalidInput
from core.events import DirectNotice, EventBus, Notice
from core.model import Inbound, MessageRef, OutcomeStatus, ScheduleStatus, SessionInfo, SessionStatus
from core.schedules.backend import DbFriendlyScheduler, build_scheduler
from core.schedules.service import creator_demoted, destination_place, schedule_view
from core.store import Database, LeaseStore
from core.store.schedules import ScheduleStore
from core.store.tables import ScheduleRow
from core.text import MAX_ID
from core.triggers import TriggerSpec
from core.trust import SenderTrust

log = logging.getLogger(__name__)

LEADER_LEASE = "scheduler"
# What the job store holds for every job: this text, never the function's own module path, so jobs
# stored by any version (the function lived in core/schedules.py before the split) resolve to it.
JOB_REF = "core.schedules:run_schedule"

_jobs: ScheduleJobs | None = None


async def run_schedule(schedule_id: int) -> None:
    """The job function APScheduler stores by reference; its one argument is the schedule id."""
    if type(schedule_id) is not int or not 0 < schedule_id <= MAX_ID:  # a job row written by someone else
        log.error("a scheduled job carried %.80r, not a schedule id; ignored", schedule_id)
        return
    if _jobs is None:
        log.error("schedule %s fired before the scheduler started", schedule_id)
        return
    await _jobs.fire(schedule_id)


@dataclass(frozen=True)
class JobSettings:
    misfire_grace_s: int = 300  # APScheduler's default is 1 s: a busy second would skip a firing
    sync_every_s: float = 5  # how soon a change made outside this process (the CLI) is followed
    lease_ttl_s: float = 30


class ScheduleJobs:
    """APScheduler's jobs for the active schedules, run in this process (with several replicas: only in
    the holder of the scheduler lease), and what one firing does."""

    def __init__(self, db: Database, store: ScheduleStore, dispatcher: Dispatcher,
                 bus: EventBus, clock: Clock, settings: JobSettings, *, deliveries: Deliveries,
                 leases: LeaseStore | None = None, trust: SenderTrust | None = None) -> None:
        self.deliveries = deliveries  # how a firing's answer landed is theirs to say
        self.trust = trust  # each firing runs on its creator's authority, checked again then
        self.db = db
        self.store = store
        self.dispatcher = dispatcher
        self.bus = bus
        self.clock = clock
        self.settings = settings
        self.leases = leases
        self.holder = dispatcher.holder
        self._scheduler: DbFriendlyScheduler | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        global _jobs
        _jobs = self
        if self.leases is None:
            await self._start_scheduler()
        else:  # several replicas: only the lease holder runs APScheduler (it must not share a job store)
            self._spawn(self._lead())
        for firing in await self.store.unfinished_firings():
            assert firing.id is not None
            self._spawn(self._finish_recovered(firing.id, firing.session_id, firing.schedule_id))
        self._spawn(self._follow_table())

    async def stop(self) -> None:
        global _jobs
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._stop_scheduler()
        if self.leases is not None:
            await self.leases.release(LEADER_LEASE, self.holder)
        _jobs = None

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow_table(self) -> None:
        """Pick up changes made outside this process (an operator's resume) every few seconds."""
        while True:
            await asyncio.sleep(self.settings.sync_every_s)
            try:
                await self.sync()
            except Exception:
                log.exception("could not sync schedules with the scheduler")

    async def _start_scheduler(self) -> None:
        self._scheduler = build_scheduler(self.db, misfire_grace_s=self.settings.misfire_grace_s)
        async with self.db.exclusive():
            self._scheduler.start()

    def _stop_scheduler(self) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduler = None

    async def _lead(self) -> None:
        assert self.leases is not None
        ttl = timedelta(seconds=self.settings.lease_ttl_s)
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
            await asyncio.sleep(self.settings.lease_ttl_s / 3)

    # -- the jobs (management's JobControl) -----------------------------------------------------

    async def add(self, schedule_id: int, trigger: TriggerSpec) -> None:
        """Schedule an active schedule's job (replacing any); not the leader: the leader syncs it in."""
        if self._scheduler is None:
            return
        async with self.db.exclusive():
            self._scheduler.add_job(JOB_REF, trigger.build(self.clock.now() - timedelta(days=1), 0),
                                    args=[schedule_id], id=_job_id(schedule_id), replace_existing=True,
                                    coalesce=True, max_instances=1, misfire_grace_time=self.settings.misfire_grace_s)
        log.info("schedule %s active (%s)", schedule_id, trigger.describe())

    async def pause(self, schedule_id: int) -> None:
        await self._change_job(schedule_id, remove=False)

    async def remove(self, schedule_id: int) -> None:
        await self._change_job(schedule_id, remove=True)

    async def _change_job(self, schedule_id: int, *, remove: bool) -> None:
        if self._scheduler is None:
            return
        change = self._scheduler.remove_job if remove else self._scheduler.pause_job
        async with self.db.exclusive():
            try:
                change(_job_id(schedule_id))
            except JobLookupError:
                pass  # no job here (not the leader when it was added, or already gone)

    async def sync(self) -> None:
        """Make APScheduler agree with the table (e.g. after a resume made by the CLI)."""
        if self._scheduler is None:
            return
        for schedule in await self.store.all(statuses=(ScheduleStatus.ACTIVE,)):
            assert schedule.id is not None
            job = self._scheduler.get_job(_job_id(schedule.id))
            spec = TriggerSpec.from_json(schedule.trigger)
            if job is None or job.next_run_time is None or _stale_cron(job.trigger, spec, self.clock.now()):
                await self.add(schedule.id, spec)

    # -- firing ---------------------------------------------------------------------------------

    async def fire(self, schedule_id: int) -> None:
        schedule = await self.store.get(schedule_id)
        if schedule is None or schedule.status != ScheduleStatus.ACTIVE:
            if schedule is None or schedule.status in (ScheduleStatus.CANCELLED, ScheduleStatus.DONE):
                await self.remove(schedule_id)
            return  # paused (e.g. from another process): skip this one
        if not await self._creator_still_trusted(schedule):
            return
        trigger = TriggerSpec.from_json(schedule.trigger)
        firing = await self.store.start_firing(schedule_id, self.clock.now(), trigger.min_gap_s())
        if firing is None:
            log.info("schedule %s: skipped a second firing for the same slot", schedule_id)
            return
        assert firing.id is not None
        log.info("schedule %s firing %s", schedule_id, firing.n)
        session = SessionInfo(
            id=firing.session_id, channel=schedule.channel, agent=schedule.agent, status=SessionStatus.IDLE,
            reply_ref=_reply_ref(schedule, channel=schedule.destination_id),  # no thread: a top-level post
            place=destination_place(schedule),
            preapproved=(("message_send", schedule.destination), ("message_send", schedule.destination_id)),
        )
        accepted = await self.dispatcher.accept(Inbound(
            session_id=session.id, channel=session.channel, sender=schedule.creator, text=schedule.prompt,
            addressed=True, reply_ref=session.reply_ref, ref=MessageRef(), idempotency_key=f"firing:{firing.id}",
            agent=schedule.agent, place=session.place, preapproved=session.preapproved,
        ), internal=True)
        await self._finish(firing.id, firing.session_id, accepted.input_id, schedule)

    async def _creator_still_trusted(self, schedule: ScheduleRow) -> bool:
        """A schedule fires at its creator's level when it was made: a creator who has left (their level is
        unknown now) or ranks lower now stops it (paused; resuming is refused while that holds), and the
        thread it was asked in and the creator are told."""
        if self.trust is None:
            return True
        assert schedule.id is not None
        demoted = await creator_demoted(self.trust, self.dispatcher.conversations, schedule)
        if demoted is None:
            return True
        now_level, made_at = demoted
        await self.trust.refused(schedule.creator, now_level, "fire", f"schedule:{schedule.id}",
                                 created_at_level=made_at.value)
        if await self.store.set_status(schedule.id, ScheduleStatus.PAUSED, now=self.clock.now(),
                                       only_from=(ScheduleStatus.ACTIVE,)):
            await self.pause(schedule.id)
            origin = await self.dispatcher.conversations.get_session(schedule.origin_session or "")
            text = (f"Schedule {schedule.id} ({schedule_view(schedule).describe()} to {schedule.destination}) is "
                    f"paused: its creator {schedule.creator} is now {now_level} (it was made at {made_at}), so "
                    "it no longer runs on their authority. It cannot be resumed while that holds; cancel it, or "
                    "have someone trusted create it again.")
            if origin is not None:
                self.bus.emit(Notice(origin, text))
            self.bus.emit(DirectNotice(_dm_session(schedule), schedule.creator, text))
        return False

    async def _finish_recovered(self, firing_id: int, session_id: str, schedule_id: int) -> None:
        schedule = await self.store.get(schedule_id)
        if schedule is not None:
            await self._finish(firing_id, session_id, await self.store.firing_input(session_id), schedule)

    async def _finish(self, firing_id: int, session_id: str, input_id: int | None, schedule: ScheduleRow) -> None:
        """Wait for the firing's answer and its delivery; record the outcome (verified, not assumed)."""
        ts: str | None = None
        error: str | None = "the firing was not accepted"
        if input_id is not None:
            outcome = await self.dispatcher.outcome(input_id)
            if outcome.status != OutcomeStatus.ANSWERED:
                error = f"{outcome.status}: {outcome.text}"
            else:
                ts, error = await self._delivery(session_id)
        retire = TriggerSpec.from_json(schedule.trigger).at is not None
        updated = await self.store.finish_firing(firing_id, ts=ts, error=error, now=self.clock.now(), retire=retire)
        if retire:
            await self.remove(updated.id or 0)
        if error:
            log.warning("schedule %s firing failed: %s", schedule.id, error)
        if updated.failures == 2:  # told once, when it starts failing for real
            self.bus.emit(DirectNotice(_dm_session(schedule), schedule.creator,
                                       f"Your schedule {schedule.id} ({schedule_view(schedule).describe()} to "
                                       f"{schedule.destination}) failed twice in a row; last error: {error}"))

    async def _delivery(self, session_id: str) -> tuple[str | None, str | None]:
        """Where the answer landed (core delivers it, retrying through outages), or why it never will."""
        turn_id = await self.store.firing_turn(session_id)
        if turn_id is None:
            return None, "no turn ran"
        delivered = await self.deliveries.wait(turn_id)
        return delivered.ref, delivered.error


def _job_id(schedule_id: int) -> str:
    return f"schedule:{schedule_id}"


def _dm_session(schedule: ScheduleRow) -> SessionInfo:
    return SessionInfo(id=f"dm:{schedule.channel}:{schedule.creator}", channel=schedule.channel, agent=schedule.agent,
                       status=SessionStatus.IDLE, reply_ref=_reply_ref(schedule, user=schedule.creator))


def _reply_ref(schedule: ScheduleRow, **ref: str) -> dict[str, str]:
    """Where a firing answers, and the session the schedule was asked for in (``origin``): the channel finds
    there what the destination alone does not say (e.g. the Slack workspace whose token posts it)."""
    return ref | ({"origin": schedule.origin_session} if schedule.origin_session else {})


def _stale_cron(stored: Any, spec: TriggerSpec, now: datetime) -> bool:
    """Whether a cron job's stored trigger is not what its expression means now: jobs stored before weekdays were
    read as cron reads them (``core.triggers.crontab_trigger``) would still fire a day late."""
    if spec.cron is None:
        return False
    try:
        return str(stored) != str(spec.build(now, 0))
    except InvalidInput:
        return False
