"""Random interleavings of arrive / repeat / cancel / turn-step / turn-end against the real dispatcher.

Invariants (SPEC §5): every accepted input ends exactly once (answered, failed, cancelled or refused,
with a reason); no two turns of one session overlap; order is kept.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections import defaultdict
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sqlmodel import select

from core.events import Event, TurnCancelled, TurnFailed, TurnFinished, TurnStarted
from core.model import Inbound, InputStatus, MessageRef
from core.store import AcceptOutcome
from core.store.tables import InputRow
from tests.fakes.core import HeldProvider, build_core

SESSIONS = ("s:a", "s:b")


class DispatcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory()
        self.keys = itertools.count()
        self.accepted: list[tuple[str, int, str]] = []  # (session, input id, key)
        self.events: list[Event] = []
        self.running: dict[str, int] = {}
        self.overlap = False

    @initialize(mode=st.sampled_from(["steer", "collect", "followup"]))
    def start(self, mode: str) -> None:
        self.provider = HeldProvider()
        self.core = build_core(Path(self.tmp.name) / "bot.db", self.provider, queue_mode=mode, debounce_s=0.0,
                               max_waiting=4, max_concurrent_turns=2)
        self.db, self.dispatcher = self.core.db, self.core.dispatcher
        self.core.bus.subscribe(self._record)
        self.run(self.core.start())

    async def _record(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, TurnStarted):
            if event.session_id in self.running:
                self.overlap = True
            self.running[event.session_id] = event.turn.id
        elif isinstance(event, TurnFinished | TurnFailed | TurnCancelled):
            self.running.pop(event.session_id, None)

    def run(self, coro: object) -> object:
        result = self.loop.run_until_complete(coro)  # type: ignore[arg-type]
        self.loop.run_until_complete(self._settle())
        return result

    async def _settle(self) -> None:
        quiet, last = 0, None
        while quiet < 2:
            await asyncio.sleep(0.003)
            state = (len(self.provider.pending), len(self.events), self.dispatcher.running_sessions)
            quiet = quiet + 1 if state == last else 0
            last = state
        await self.dispatcher.bus.drain(1)

    def _inbound(self, session: str, key: str, text: str) -> Inbound:
        return Inbound(session_id=session, channel="test", sender="U1", text=text, addressed=True,
                       ref=MessageRef("C", key), idempotency_key=key)

    @rule(session=st.sampled_from(SESSIONS))
    def arrive(self, session: str) -> None:
        key = f"k{next(self.keys)}"
        result = self.run(self.dispatcher.accept(self._inbound(session, key, f"message {key}")))
        assert result.outcome in (AcceptOutcome.QUEUED, AcceptOutcome.REFUSED)  # type: ignore[attr-defined]
        self.accepted.append((session, result.input_id, key))  # type: ignore[attr-defined]

    @precondition(lambda self: bool(self.accepted))
    @rule(data=st.data())
    def repeat(self, data: st.DataObject) -> None:
        session, input_id, key = data.draw(st.sampled_from(self.accepted))
        result = self.run(self.dispatcher.accept(self._inbound(session, key, "again")))
        assert result.outcome is AcceptOutcome.DUPLICATE and result.input_id == input_id  # type: ignore[attr-defined]

    @rule(session=st.sampled_from(SESSIONS))
    def stop(self, session: str) -> None:
        self.run(self.dispatcher.cancel(session, by="tester"))

    @rule(pick=st.integers(0, 7), step=st.booleans())
    def model_answers(self, pick: int, step: bool) -> None:
        # Which calls are held depends on timing, so no precondition on it (hypothesis needs rules
        # chosen from data alone): with none held this step does nothing.
        if self.provider.pending:
            self.provider.resolve(pick % len(self.provider.pending), step=step)
            self.run(asyncio.sleep(0))

    @invariant()
    def turns_of_a_session_never_overlap(self) -> None:
        assert not self.overlap

    def teardown(self) -> None:
        if hasattr(self, "dispatcher"):
            self.run(self._finish_every_input())
            self.run(self._check_every_input_ended_once())
            self.run(self.core.stop(drain_s=1))
        self.loop.close()
        self.tmp.cleanup()

    async def _finish_every_input(self) -> None:
        # Every held call gets a final answer until each input has its outcome. A waiting input's
        # turn may start only once a slot frees, after a moment with nothing running, so "nothing
        # held and nothing running" alone does not mean finished.
        deadline = self.loop.time() + 20
        for _session, input_id, _key in self.accepted:
            ended = asyncio.ensure_future(self.dispatcher.outcome(input_id))
            while not ended.done():
                if self.provider.pending:
                    self.provider.resolve(0, step=False)
                await asyncio.wait({ended}, timeout=0.005)
                if self.loop.time() > deadline:
                    ended.cancel()
                    raise AssertionError(f"input {input_id} never ended")
        # An input's outcome is on record a moment before its turn's driver lets the session go.
        while self.provider.pending or self.dispatcher.running_sessions:
            if self.provider.pending:
                self.provider.resolve(0, step=False)
            await asyncio.sleep(0.005)
            if self.loop.time() > deadline:
                raise AssertionError("a session was still running after every input ended")

    async def _check_every_input_ended_once(self) -> None:
        assert not self.provider.pending and not self.dispatcher.running_sessions
        for _session, input_id, _key in self.accepted:
            outcome = await asyncio.wait_for(self.dispatcher.outcome(input_id), 2)
            assert outcome.status in ("answered", "failed", "cancelled", "refused") and outcome.text
        ends = defaultdict(int)
        for event in self.events:
            if isinstance(event, TurnFinished | TurnFailed | TurnCancelled):
                ends[event.turn.id] += 1
        starts = {e.turn.id for e in self.events if isinstance(e, TurnStarted)}
        assert set(ends) == starts and all(n == 1 for n in ends.values())  # each turn ends exactly once
        async with self.db.read() as s:
            rows = (await s.exec(select(InputRow).order_by(InputRow.id))).all()  # type: ignore[arg-type]
        for session in SESSIONS:
            written = [r.message_id for r in rows if r.session_id == session and r.message_id is not None]
            assert written == sorted(written)  # taken into the transcript in arrival order
            assert all(r.status != InputStatus.WAITING for r in rows if r.session_id == session)
        for row in rows:  # each ended, and the transcript agrees: taken ones are in it, refused ones are not
            assert row.status in (InputStatus.TAKEN, InputStatus.CANCELLED, InputStatus.REFUSED), row
            if row.status == InputStatus.TAKEN:
                assert row.message_id is not None, row
            if row.status == InputStatus.REFUSED:
                assert row.message_id is None and row.note, row


DispatcherMachine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestDispatcherInterleavings = DispatcherMachine.TestCase
