"""A turn failed after restarts takes its pending requests with it: their cards are told so.

The cancel itself is in the same commit that fails the turn (``ConversationStore.requeue_interrupted``);
this only announces it, so an approval or credential card stops offering buttons that can do nothing.
"""

from __future__ import annotations

from core.approvals import ApprovalBroker
from core.connections.service import ConnectionService
from core.credentials import CredentialService
from core.events import ApprovalResolved, ConnectionResolved, CredentialResolved, Event, EventBus, TurnFailed
from core.model import ApprovalStatus, ConnectionStatus, CredentialStatus

INTERRUPTED = "interrupted"  # TurnFailed.kind of a turn failed after restarts


def announce_cancelled_requests(bus: EventBus, approvals: ApprovalBroker, credentials: CredentialService,
                                connections: ConnectionService | None = None) -> None:
    async def on_event(event: Event) -> None:
        if not isinstance(event, TurnFailed) or event.kind != INTERRUPTED:
            return
        for approval in await approvals.recent(event.session.id):
            if approval.turn_id == event.turn.id and approval.status == ApprovalStatus.CANCELLED:
                bus.emit(ApprovalResolved(approval.session, approval))
        for request in await credentials.recent(event.session.id):
            if request.turn_id == event.turn.id and request.status == CredentialStatus.CANCELLED:
                bus.emit(CredentialResolved(request.session, request))
        for parked in await connections.store.recent(event.session.id) if connections is not None else []:
            if parked.turn_id == event.turn.id and parked.status == ConnectionStatus.CANCELLED:
                bus.emit(ConnectionResolved(parked.session, parked))

    bus.subscribe(on_event)
