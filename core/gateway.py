"""The one object channel adapters call: intake, decisions, credentials, stop, commands, listings, status.

Adapters translate a platform's input into these calls and render what comes back (and the events
they subscribe to). Every rule stays in the service that owns it (``Dispatcher``, ``ApprovalBroker``,
``CredentialService``, ``ScheduleService``); this facade only routes, so that a channel needs
nothing else from core but values (``core.model``, ``core.views``, ``core.events``) and errors.
Refusals are typed (``core.errors``): a channel picks its answer by the type, never by the words.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from core.approval_edits import BATCH_VERDICTS, ApprovalEdits, BatchDecision, EditResult
from core.approval_policy import DecideResult
from core.approvals import TOO_LONG_TO_SHOW, ApprovalBroker
from core.clock import Clock
from core.commands import Command, Commands, Status
from core.connections.consent import NOT_YOURS, CallbackResult, Consent, Opened, Preview
from core.controls import StopReport
from core.credentials import CredentialService, ProvideResult
from core.dispatcher import Dispatcher
from core.errors import InvalidInput, NotAllowed, NotFound
from core.events import Handler
from core.feedback import FeedbackBook, FeedbackResult
from core.model import (
    ApprovalInfo,
    ConnectionRequestInfo,
    CredentialRequestInfo,
    Inbound,
    SessionInfo,
    SessionSummary,
    TranscriptEntry,
)
from core.people import Person
from core.replies import PLAIN, Marks
from core.schedules import ScheduleService
from core.store import Accepted, AcceptOutcome
from core.views import ConnectionView, GrantView, ScheduleView

# What adapters may name without importing the services that produce them.
__all__ = ["AcceptOutcome", "Accepted", "BatchDecision", "CallbackResult", "Command", "DecideResult", "EditResult",
           "FeedbackResult", "Gateway", "Marks", "Opened", "Preview", "ProvideResult", "Status", "StopReport"]

VERDICTS = ("approve", "deny", "always", "thread")  # thread: Allow in this thread
REASON_MAX = 500  # characters of a deny reason (the model reads it)


class Gateway:
    """Core's front door for the channels; every service behind it is built by the wiring and handed in."""

    def __init__(self, dispatcher: Dispatcher, approvals: ApprovalBroker, credentials: CredentialService,
                 schedules: ScheduleService, *, commands: Commands, feedback: FeedbackBook,
                 edits: ApprovalEdits, consent: Consent | None = None) -> None:
        self._dispatcher = dispatcher
        self._edits = edits  # Approve all / Deny all, and an approver's Edit
        self._consent = consent
        self._conversations = dispatcher.conversations
        self._approvals = approvals
        self._credentials = credentials
        self._schedules = schedules
        self._commands = commands
        self._feedback = feedback

    # -- events and time ------------------------------------------------------------------------

    def subscribe(self, handler: Handler, *, channel: str) -> None:
        """Receive core's events for ``channel``'s sessions (and those for every channel)."""
        self._dispatcher.bus.subscribe(handler, channel=channel)

    @property
    def clock(self) -> Clock:
        return self._dispatcher.clock

    # -- intake and stopping --------------------------------------------------------------------

    async def accept(self, message: Inbound) -> Accepted:
        """Store one message durably (deduplicated) and act on it. Raises InvalidInput (refused, with the
        reason to tell the sender) or Unavailable (not taking messages right now)."""
        return await self._dispatcher.accept(message)

    async def stop(self, session_id: str, by: str) -> StopReport:
        """Stop a conversation's running turn and drop what waits behind it (a channel's stop button)."""
        return await self._dispatcher.cancel(session_id, by=by)

    async def stop_thread(self, session_id: str, by: str, *, turn_id: int | None = None,
                          started_before: datetime | None = None) -> StopReport:
        """A person's Stop in one conversation (a button, a shortcut, the platform's own stop control):
        NotAllowed unless they may control it; with ``turn_id``, only while that very turn runs; with
        ``started_before`` (when the platform saw the click), only a turn that had started by then."""
        return await self._dispatcher.stop_session(session_id, by=by, turn_id=turn_id, started_before=started_before)

    async def workspace_removed(self, channel: str, belongs: Callable[[str, Mapping[str, Any]], bool], *,
                                why: str) -> int:
        """A place ``channel`` can no longer reach (the app was uninstalled from a Slack workspace); ``belongs``
        tells its conversations by (session id, reply reference). Each of them that works or waits is stopped,
        and what its turns wait on (approvals, credentials, connections) cancelled, noted ``stopped by <why>``;
        the schedules asked for there are paused (a re-install can resume them). History stays. How many
        conversations were stopped."""
        await self._schedules.pause_asked_in(lambda origin: belongs(origin, {}), by=why)
        stopped = [s for s in await self._dispatcher.conversations.busy_sessions(channel)
                   if belongs(s.id, s.reply_ref)]
        for session in stopped:
            await self._dispatcher.cancel(session.id, why, announce=False)  # nothing can be posted there now
        return len(stopped)

    async def command(self, command: Command, marks: Marks = PLAIN) -> str:
        """The ``/bot`` command: the reply, its dynamic parts marked up by ``marks``."""
        return await self._commands.run(command, marks)

    async def status(self) -> Status:
        return await self._commands.status()

    @property
    def accepting(self) -> bool:
        return self._dispatcher.accepting

    # -- approvals ------------------------------------------------------------------------------

    async def decide(self, request_id: int, verdict: object, by: str, reason: object = None, *,
                     channel: str) -> DecideResult:
        """A person's Approve / Deny / Always allow / Allow in this thread (``verdict`` and ``reason`` as they
        arrived: checked here). ``by`` is a person of ``channel``, where only that channel's requests exist
        (NotFound, as for an unknown id): so the broker judges them as a person of the request's channel."""
        if not isinstance(verdict, str) or verdict not in VERDICTS:
            raise InvalidInput("verdict must be approve, deny, always or thread")
        if reason is not None and (not isinstance(reason, str) or len(reason) > REASON_MAX):
            raise InvalidInput(f"reason must be text of at most {REASON_MAX} characters")
        _owned(await self._approvals.get(request_id), channel, "approval request")
        return await self._approvals.decide(request_id, verdict, by=by, reason=reason)

    async def deny_prompt(self, request_id: int, by: str, *, channel: str) -> ApprovalInfo | DecideResult:
        """A Deny click, before the reason is asked: the request when ``by`` (of ``channel``) may deny it now,
        else what a deny achieved (a refusal, or what had already happened). NotFound as for ``decide``."""
        request = await self._approvals.get(request_id)
        _owned(request, channel, "approval request")
        if request is None or request.settled or not await self._approvals.may_decide(by, request):
            return await self._approvals.decide(request_id, "deny", by=by)
        return request

    async def decide_all(self, request_id: int, verdict: object, by: str, *, channel: str) -> BatchDecision:
        """Approve all / Deny all on the card of ``request_id``'s batch: one decision per still-pending request of
        it, each through its own policy (the batch is read from the stored request, never from the click)."""
        if not isinstance(verdict, str) or verdict not in BATCH_VERDICTS:
            raise InvalidInput("verdict must be approve or deny")
        _owned(await self._approvals.get(request_id), channel, "approval request")
        return await self._edits.decide_all(request_id, verdict, by)

    async def approval_batch(self, request: ApprovalInfo) -> list[ApprovalInfo]:
        """Every request of ``request``'s batch as it now stands (just ``request`` when it has none)."""
        return await self._edits.batch(request)

    async def edit_prompt(self, request_id: int, by: str, *, channel: str) -> ApprovalInfo | str:
        """An Edit click, before the edit box opens: the request when ``by`` may edit it, else why not."""
        _owned(await self._approvals.get(request_id), channel, "approval request")
        return await self._edits.may_edit(request_id, by)

    async def edit(self, request_id: int, arguments: object, by: str, *, channel: str) -> EditResult:
        """Approve the call with changed ``arguments`` (JSON text, as the person wrote it): core checks it all."""
        if not isinstance(arguments, str):
            raise InvalidInput("the arguments must be JSON text")
        _owned(await self._approvals.get(request_id), channel, "approval request")
        return await self._edits.edit(request_id, arguments, by)

    async def approval(self, request_id: int) -> ApprovalInfo | None:
        return await self._approvals.get(request_id)

    async def recent_approvals(self, session_id: str) -> list[ApprovalInfo]:
        return await self._approvals.recent(session_id)

    async def grants(self, *, place: str | None = None, viewer: Person | None = None) -> list[GrantView]:
        return await self._approvals.grants(place=place, viewer=viewer)

    async def approval_shown(self, request_id: int, where: dict[str, Any]) -> None:
        """Where a channel showed the request, so the message can be updated once it is settled."""
        await self._approvals.record_announcement(request_id, where)

    async def approval_unshowable(self, request_id: int) -> bool:
        """The channel could not show every argument: nobody can decide unseen, so the call is cancelled."""
        return await self._approvals.refuse(request_id, TOO_LONG_TO_SHOW)

    # -- credentials ----------------------------------------------------------------------------

    async def provide(self, request_id: int, value: str, by: str, *, hosts: object = None,
                      channel: str) -> ProvideResult:
        """A person's value for a credential request (sealed at once). ``by`` is a person of ``channel``, where
        only that channel's requests exist (NotFound otherwise)."""
        _owned(await self._credentials.get(request_id), channel, "credential request")
        return await self._credentials.provide(request_id, value, by=by, hosts=hosts)

    async def provide_prompt(self, request_id: int, by: str, *, channel: str) -> CredentialRequestInfo | str:
        """A Provide click, before the form opens: the request when ``by`` (of ``channel``) may provide it now,
        else why not (core's words, in core's order: not an approver, already settled). NotFound as for
        ``provide``."""
        request = await self._credentials.get(request_id)
        _owned(request, channel, "credential request")
        refused = await self._credentials.refusal(request, by)
        if refused is not None:
            return refused
        assert request is not None  # refusal() refuses an unknown request
        return request

    async def credential_request(self, request_id: int) -> CredentialRequestInfo | None:
        return await self._credentials.get(request_id)

    async def recent_credentials(self, session_id: str) -> list[CredentialRequestInfo]:
        return await self._credentials.recent(session_id)

    async def credential_shown(self, request_id: int, where: dict[str, Any]) -> None:
        await self._credentials.record_announcement(request_id, where)

    # -- connections ----------------------------------------------------------------------------

    def _connections(self) -> Consent:
        if self._consent is None:
            raise NotFound("no connections are configured")
        return self._consent

    async def connect_link(self, request_id: int, by: str, *, channel: str) -> str:
        """A personal, single-use link for ``by`` to complete a parked connection request (NotFound when it is
        not open, not theirs, or not in ``channel``: one answer for all three)."""
        consent = self._connections()
        request = await consent.service.get(request_id)
        if request is None or request.session.channel != channel:
            raise NotFound(NOT_YOURS)
        return await consent.link(request_id, by, channel)

    async def preview_consent(self, state: str) -> Preview | CallbackResult:
        return await self._connections().preview(state)

    async def open_consent(self, state: str) -> Opened | CallbackResult:
        return await self._connections().open(state)

    async def finish_consent(self, *, state: str, code: str, error: str, binding: str) -> CallbackResult:
        return await self._connections().callback(state=state, code=code, error=error, binding=binding)

    async def connection_request(self, request_id: int) -> ConnectionRequestInfo | None:
        return await self._connections().service.get(request_id)

    async def connection_shown(self, request_id: int, where: dict[str, Any]) -> None:
        await self._connections().service.record_announcement(request_id, where)

    async def recent_connection_requests(self, session_id: str) -> list[ConnectionRequestInfo]:
        if self._consent is None:
            return []
        return await self._consent.service.requests.recent(session_id)

    async def connections_of(self, user: str) -> list[ConnectionView]:
        """``user``'s connected accounts and the shared ones (never a token)."""
        if self._consent is None:
            return []
        return await self._consent.service.views(user, with_shared=True)

    async def disconnect(self, name: str, by: str, *, channel: str) -> str:
        """``by`` (of ``channel``) disconnects their own account (a shared one: an admin). Revoked at the
        provider first."""
        service = self._connections().service
        spec = service.specs.get(name)
        if spec is None:
            raise NotFound(f"no connection named {name!r} is configured")
        if spec.owner == "shared" and not service.policy.is_admin(by, channel=channel):
            raise NotAllowed(f"{name} is shared: only an admin disconnects it")
        if spec.owner == "user" and not service.holds_accounts(by, channel):  # another channel's person's
            raise NotFound(f"there is no {name} connection of {by}")
        return await service.disconnect(name, by, by=by)

    # -- conversations --------------------------------------------------------------------------

    async def sessions(self, channel: str) -> list[SessionSummary]:
        return await self._conversations.list_sessions(channel)

    async def session(self, session_id: str) -> SessionInfo | None:
        return await self._conversations.get_session(session_id)

    async def thread_opened(self, session_id: str, reply_ref: dict[str, Any], *, was: dict[str, Any]
                            ) -> dict[str, Any]:
        """A conversation's first post opened the place it goes on in (a Slack thread): from now on it is answered
        at ``reply_ref``, unless its reference is no longer ``was`` (another post, maybe another replica's,
        opened one first). The reference now in force, which every later post must use. Core reads nothing in
        it: what a reference means is the channel's. NotFound: no such conversation."""
        stored = await self._conversations.replace_reply_ref(session_id, was, reply_ref)
        if stored is None:
            raise NotFound(f"no conversation {session_id}")
        return stored

    async def history(self, session_id: str) -> list[TranscriptEntry]:
        return await self._conversations.history(session_id)

    async def working(self, session_id: str) -> bool:
        return await self._conversations.has_live_work(session_id)

    # -- feedback -------------------------------------------------------------------------------

    async def feedback(self, turn_id: object, verdict: object, by: str, *, channel: str,
                       posted_in: str | None = None, session_id: str | None = None) -> FeedbackResult:
        """A person's verdict on an answer (``positive`` | ``negative``), clicked where it was posted (the
        place's id, or the conversation)."""
        return await self._feedback.give(turn_id, verdict, by, channel=channel, posted_in=posted_in,
                                         session_id=session_id)

    # -- schedules ------------------------------------------------------------------------------

    async def schedules(self, *, place: str | None = None, viewer: Person | None = None) -> list[ScheduleView]:
        """As ``ScheduleService.list``: a viewer sees this place's schedules (an admin every one)."""
        return await self._schedules.list(place=place, viewer=viewer)

    def may_change_schedule(self, schedule: ScheduleView, user: str, *, channel: str) -> bool:
        return self._schedules.may_change(schedule, user, channel=channel)

    async def change_schedule(self, schedule_id: int, action: str, by: str, *, channel: str) -> str:
        """pause, resume or cancel, by a person of ``channel``. Raises NotFound, NotAllowed, Conflict or
        InvalidInput."""
        return await self._schedules.change(schedule_id, action, by=by, channel=channel)


def _owned(request: ApprovalInfo | CredentialRequestInfo | None, channel: str, what: str) -> None:
    """A request shown in another channel does not exist here (the same refusal as an unknown id)."""
    if request is None or request.session.channel != channel:
        raise NotFound(f"no such {what} here")
