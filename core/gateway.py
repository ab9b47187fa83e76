"""The gateway: the one entry point channel adapters call, and the loop that runs turns.

Single flight per session (turns of one session run one after another, oldest first) and at most
``max_concurrent_turns`` turns at once across sessions. The database holds every queued turn; the
in-memory driver table is only a wake-up signal, rebuilt from the database at start.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

from core.agents import AgentDirectory
from core.clock import Clock
from core.errors import CoreError, InvalidInput, ProviderError, StepLimitReached
from core.events import EventBus, TurnCancelled, TurnFailed, TurnFinished, TurnStarted
from core.model import RESERVED_SESSION_PREFIXES, Inbound, TurnInfo, TurnStatus
from core.runner import AgentRunner
from core.store import ConversationStore
from core.store.conversations import Accepted, AcceptOutcome

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 40_000
DELIVERY_RETENTION = timedelta(days=2)  # Slack retries for minutes; keep ids far longer than that


@dataclass(frozen=True)
class GatewayConfig:
    max_concurrent_turns: int = 8
    record_thread_context: bool = True
    max_turn_attempts: int = 2  # a turn interrupted by a crash is continued once, then failed


@dataclass
class _Driver:
    task: asyncio.Task[None]
    wake: bool = False
    turn: asyncio.Task[str] | None = None  # the running turn's own task, so it can be cancelled alone
    cancelled_by: str | None = None


class Gateway:
    def __init__(
        self,
        store: ConversationStore,
        runner: AgentRunner,
        agents: AgentDirectory,
        bus: EventBus,
        clock: Clock,
        config: GatewayConfig = GatewayConfig(),
    ) -> None:
        self.store = store
        self.runner = runner
        self.agents = agents
        self.bus = bus
        self.clock = clock
        self.config = config
        self._slots = asyncio.Semaphore(config.max_concurrent_turns)
        self._drivers: dict[str, _Driver] = {}
        self._accepting = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover what the last process left, then resume every queued turn."""
        failed = await self.store.requeue_interrupted(self.config.max_turn_attempts, self.clock.now())
        for turn_id in failed:
            info = await self.store.turn_info(turn_id)
            if info is not None:
                self.bus.emit(TurnFailed(info, "interrupted", _INTERRUPTED_TWICE))
        for session_id in await self.store.sessions_with_live_turns():
            self._kick(session_id)
        await self.store.prune_deliveries(self.clock.now() - DELIVERY_RETENTION)
        self._accepting = True

    async def stop(self, drain_s: float) -> None:
        """Stop taking input, give running turns ``drain_s`` to finish; the rest resume at next start."""
        self._accepting = False
        tasks = [d.task for d in self._drivers.values()]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.bus.drain(timeout=5)

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def running_sessions(self) -> int:
        return len(self._drivers)

    # -- intake ---------------------------------------------------------------------------------

    async def accept(self, message: Inbound) -> Accepted:
        """Store one inbound message (durably, deduplicated) and queue its turn if it asks for one."""
        if message.session_id.startswith(RESERVED_SESSION_PREFIXES):
            raise InvalidInput(f"session id {message.session_id!r} is reserved")
        if len(message.text) > MAX_TEXT_CHARS:
            raise InvalidInput(f"message is longer than {MAX_TEXT_CHARS} characters")
        if not self._accepting:
            raise CoreError("the gateway is not accepting messages right now")
        agent = self.agents.get(message.agent).name
        result = await self.store.accept(
            message, agent=agent, record_context=self.config.record_thread_context, now=self.clock.now()
        )
        if result.outcome is AcceptOutcome.QUEUED:
            self._kick(message.session_id)
        return result

    async def cancel(self, session_id: str, by: str | None) -> bool:
        """Stop the session's running turn at its next await. Returns False when nothing was running."""
        driver = self._drivers.get(session_id)
        if driver is None or driver.turn is None or driver.turn.done():
            return False
        driver.cancelled_by = by or "someone"
        driver.turn.cancel()
        return True

    # -- turn driving ---------------------------------------------------------------------------

    def _kick(self, session_id: str) -> None:
        driver = self._drivers.get(session_id)
        if driver is not None:
            driver.wake = True
            return
        task = asyncio.create_task(self._drive(session_id), name=f"turns:{session_id}")
        self._drivers[session_id] = _Driver(task)

    async def _drive(self, session_id: str) -> None:
        try:
            while True:
                driver = self._drivers[session_id]
                driver.wake = False
                async with self._slots:
                    turn = await self.store.start_next_turn(session_id, self.clock.now())
                    if turn is not None:
                        await self._run(turn)
                if turn is None and not driver.wake:
                    return
        except Exception:
            log.exception("turn driver for %s stopped", session_id)
        finally:
            self._drivers.pop(session_id, None)

    async def _run(self, turn: TurnInfo) -> None:
        agent = self.agents.get(turn.session.agent)
        driver = self._drivers[turn.session.id]
        log.info("turn %s started (session %s)", turn.id, turn.session.id)
        self.bus.emit(TurnStarted(turn))
        driver.turn = asyncio.create_task(self.runner.run(turn, agent), name=f"turn:{turn.id}")
        driver.cancelled_by = None
        try:
            answer = await driver.turn
        except asyncio.CancelledError:
            if driver.cancelled_by is None or _current_task_cancelling():
                log.warning("turn %s interrupted; it resumes at the next start", turn.id)
                raise
            await self.store.finish_turn(turn.id, status=TurnStatus.CANCELLED, answer=None,
                                         error=f"stopped by {driver.cancelled_by}", now=self.clock.now())
            log.info("turn %s stopped by %s", turn.id, driver.cancelled_by)
            self.bus.emit(TurnCancelled(turn, driver.cancelled_by))
        except ProviderError as exc:
            await self._fail(turn, exc.kind, exc.user_message)
        except StepLimitReached as exc:
            await self._fail(turn, "step_limit", str(exc))
        except Exception as exc:
            log.exception("turn %s failed", turn.id)
            await self._fail(
                turn, "internal",
                f"Something went wrong on my side ({type(exc).__name__}). It is logged; "
                "try again, and tell the operator if it keeps happening.",
            )
        else:
            await self.store.finish_turn(
                turn.id, status=TurnStatus.FINISHED, answer=answer, error=None, now=self.clock.now()
            )
            log.info("turn %s finished (session %s)", turn.id, turn.session.id)
            self.bus.emit(TurnFinished(turn, answer or "(the model returned an empty answer)"))
        finally:
            driver.turn = None

    async def _fail(self, turn: TurnInfo, kind: str, message: str) -> None:
        log.warning("turn %s failed (%s): %s", turn.id, kind, message)
        await self.store.finish_turn(turn.id, status=TurnStatus.FAILED, answer=None, error=message,
                                     now=self.clock.now())
        self.bus.emit(TurnFailed(turn, kind, message))


def _current_task_cancelling() -> bool:
    """True when the driver itself is being cancelled (shutdown), not just the turn it awaits."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


_INTERRUPTED_TWICE = (
    "I was restarted twice while working on this and stopped, so it may be half done. "
    "Check the state of anything I was changing, then ask again."
)
