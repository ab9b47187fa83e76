"""``[[connections]]`` in ``bot.toml`` (SPEC §16): OAuth providers, checked strictly at start.

The client secret is never in the file: ``client_secret_env`` names the environment variable (or a line of
``.env``) that holds it. Endpoints must be https (plain http only to this machine, for a local provider).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from yarl import URL

from bot.config_file import read_config, strings
from bot.errors import SettingsError
from bot.oauth_client import HttpOAuthClient
from bot.settings import Settings
from core.approvals import ApprovalPolicy
from core.clock import Clock
from core.connections.consent import Consent
from core.connections.service import ConnectionService
from core.connections.spec import ConnectionSpec
from core.credentials import CredentialService
from core.events import EventBus
from core.hosts import default_hosts, parse_hosts
from core.store import Database
from core.store.connections import ConnectionStore
from core.stored_secrets import NAME

_KEYS = {"name", "authorize_url", "token_url", "revoke_url", "client_id", "client_secret_env", "scopes", "hosts",
         "owner"}


def load_connections(path: Path, *, env_file: Path | None = Path(".env")) -> dict[str, ConnectionSpec]:
    data = read_config(path)
    if "connections" not in data:
        return {}
    entries = data["connections"]
    if not isinstance(entries, list):
        raise SettingsError(f"{path}: [[connections]] must be an array of tables")
    dotenv: dict[str, str | None] = dict(dotenv_values(env_file)) if env_file and env_file.exists() else {}
    specs: dict[str, ConnectionSpec] = {}
    for index, entry in enumerate(entries):
        spec = _connection(f"{path}: connections[{index}]", entry, dotenv)
        if spec.name in specs:
            raise SettingsError(f"{path}: connection {spec.name!r} is defined twice")
        specs[spec.name] = spec
    return specs


def _connection(where: str, entry: Any, dotenv: dict[str, str | None]) -> ConnectionSpec:
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a table")
    unknown = set(entry) - _KEYS
    if unknown:
        raise SettingsError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise SettingsError(f"{where}.name must match {NAME.pattern} (e.g. 'github')")
    where = f"{where} ({name})"
    token_url = _endpoint(where, "token_url", entry.get("token_url"), required=True)
    assert token_url is not None
    client_id = entry.get("client_id")
    if not isinstance(client_id, str) or not client_id.strip():
        raise SettingsError(f"{where}.client_id must be the OAuth app's client id")
    secret = ""
    if (variable := entry.get("client_secret_env")) is not None:
        if not isinstance(variable, str) or not variable.isidentifier():
            raise SettingsError(f"{where}.client_secret_env must name an environment variable (e.g. GITHUB_SECRET)")
        secret = os.environ.get(variable) or str(dotenv.get(variable) or "")
        if not secret:
            raise SettingsError(f"{where}: the environment variable {variable} (client_secret_env) is not set; "
                                "set it to the OAuth app's client secret")
    owner = entry.get("owner", "user")
    if owner not in ("user", "shared"):
        raise SettingsError(f"{where}.owner must be 'user' (each person connects their own) or 'shared'")
    scopes = tuple(strings(where, "scopes", entry.get("scopes", [])))
    if any(" " in scope for scope in scopes):
        raise SettingsError(f"{where}.scopes: give each scope as its own string (no spaces)")
    if "hosts" in entry:
        hosts, problem = parse_hosts(strings(where, "hosts", entry["hosts"]))
        if problem is not None or not hosts:
            raise SettingsError(f"{where}.hosts: {problem or 'name at least one host'}")
    else:
        hosts = default_hosts(URL(token_url).raw_host or "")
    return ConnectionSpec(
        name=name, token_url=token_url, client_id=client_id.strip(), client_secret=secret, scopes=scopes,
        authorize_url=_endpoint(where, "authorize_url", entry.get("authorize_url"), required=False),
        revoke_url=_endpoint(where, "revoke_url", entry.get("revoke_url"), required=False),
        hosts=tuple(hosts), owner=owner, hosts_defaulted="hosts" not in entry)


def _endpoint(where: str, key: str, value: Any, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise SettingsError(f"{where}.{key} must be an https:// URL")
    try:
        url = URL(value)
    except ValueError:
        raise SettingsError(f"{where}.{key} is not a valid URL") from None
    if url.scheme == "https" and url.raw_host:
        return value
    if url.scheme == "http" and url.raw_host and _loopback(url.raw_host):
        return value  # a provider on this machine (development, tests)
    raise SettingsError(f"{where}.{key} must be an https:// URL (it carries the client secret and tokens)")


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def build_connections(settings: Settings, db: Database, credentials: CredentialService, bus: EventBus, clock: Clock,
                      policy: ApprovalPolicy, *, base_url: Callable[[], str] | None = None) -> Consent | None:
    """``[[connections]]``: None when bot.toml has none. Tokens are masked like credentials (and their
    client secrets like the bot's own settings). ``base_url``: where links and the redirect URI point (asked
    when one is made: the port may be known only once the bot listens)."""
    specs = load_connections(settings.bot_config)
    if not specs:
        return None
    service = ConnectionService(specs, ConnectionStore(db), credentials.keys, HttpOAuthClient(clock.now), bus, clock,
                                policy, timeout_s=settings.connection_timeout_s, poll_s=settings.approval_poll_s,
                                learn=credentials.redactor.learn)
    credentials.also_masked.append(service.known_values)
    credentials.redactor.add_static((f"{spec.name} client secret", spec.client_secret) for spec in specs.values())
    return Consent(service, base_url=base_url or (lambda: settings.bot_public_url or f"http://127.0.0.1:{settings.port}"))
