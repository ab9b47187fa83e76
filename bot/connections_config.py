"""The connection service built from ``[[connections]]`` (bot.config.connections checks the table)."""

from __future__ import annotations

from collections.abc import Callable

from bot.oauth_client import HttpOAuthClient
from bot.settings import Settings
from core.approval_policy import ApprovalPolicy
from core.clock import Clock
from core.connections.consent import Consent
from core.connections.service import ConnectionService
from core.connections.spec import ConnectionSpec
from core.credentials import CredentialService
from core.events import EventBus
from core.store import Database
from core.store.connections import ConnectionStore


def build_connections(settings: Settings, specs: dict[str, ConnectionSpec], db: Database,
                      credentials: CredentialService, bus: EventBus, clock: Clock, policy: ApprovalPolicy, *,
                      base_url: Callable[[], str] | None = None) -> Consent | None:
    """``[[connections]]``: None when bot.toml has none. Tokens are masked like credentials (and their
    client secrets like the bot's own settings). ``base_url``: where links and the redirect URI point (asked
    when one is made: the port may be known only once the bot listens)."""
    if not specs:
        return None
    service = ConnectionService(specs, ConnectionStore(db), credentials.keys, HttpOAuthClient(clock.now), bus, clock,
                                policy, timeout_s=settings.connection_timeout_s, poll_s=settings.approval_poll_s,
                                learn=credentials.redactor.learn)
    credentials.also_masked.append(service.known_values)
    credentials.redactor.add_static((f"{spec.name} client secret", spec.client_secret) for spec in specs.values())
    return Consent(service, base_url=base_url or (lambda: settings.bot_public_url or f"http://127.0.0.1:{settings.port}"))
