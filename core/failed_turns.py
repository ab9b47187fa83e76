"""A turn failed after restarts takes its pending requests with it: their cards are told so.

The cancel itself is in the same commit that fails the turn (``ConversationStore.requeue_interrupted``);
this only announces it, so an approval, credential or connection card stops offering buttons that can do
nothing.
"""

from __future__ import annotations

from typing import Any

from core.approvals import ApprovalBroker
from core.connections.service import ConnectionService
from core.credentials import CredentialService
from core.events import Event, EventBus, TurnFailed
from core.requests import PersonRequests

INTERRUPTED = "interrupted"  # TurnFailed.kind of a turn failed after restarts


def announce_cancelled_requests(bus: EventBus, approvals: ApprovalBroker, credentials: CredentialService,
                                connections: ConnectionService | None = None) -> None:
    kinds: list[PersonRequests[Any]] = [approvals.requests, credentials.requests]
    if connections is not None:
        kinds.append(connections.requests)

    async def on_event(event: Event) -> None:
        if not isinstance(event, TurnFailed) or event.kind != INTERRUPTED:
            return
        for requests in kinds:
            await requests.announce_cancelled(event.session.id, event.turn.id)

    bus.subscribe(on_event)
