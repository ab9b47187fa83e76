"""Stored secrets (SPEC §8): what a credential may be named, which stored row a tool uses, where its
value may be sent, and opening it. Requests for one are core.credentials; one-time links to
provide one, core.credential_links.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from core.errors import VaultError
from core.hosts import host_allowed
from core.store.credentials import CredentialStore
from core.store.tables import SecretRow
from core.vault import LEGACY_AAD, ROW_AAD, KeyRing, Sealed, row_context
from core.views import CredentialView

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def env_name(name: str) -> str:
    """``github.token`` → ``GITHUB_TOKEN`` (SPEC §2)."""
    return re.sub(r"[.-]", "_", name).upper()


def how_to_use(row: SecretRow) -> str:
    """How an agent uses a stored credential, told when it asks for one it already has."""
    name, hosts = row.name, hosts_of(row)
    if hosts is not None:
        return (f"http_request takes credential={name!r} and sends it only to {', '.join(hosts)}; "
                "shell_run cannot be given it")
    return (f"pass credentials=[{name!r}] to shell_run and it sees ${env_name(name)}; "
            f"http_request takes credential={name!r}")


def hosts_of(row: SecretRow) -> list[str] | None:
    """The hosts a stored credential may be sent to; None: anywhere."""
    if not row.hosts:
        return None
    hosts = json.loads(row.hosts)
    return [str(h) for h in hosts] if isinstance(hosts, list) else None


async def credential_views(store: CredentialStore) -> list[CredentialView]:
    """Every stored credential, as listed (no ciphertext leaves core)."""
    views = []
    for row in await store.all_secrets():
        assert row.id is not None
        hosts = hosts_of(row)
        views.append(CredentialView(
            name=row.name, scope=row.scope, agent=row.agent, granted_to=tuple(await store.grants_of(row.id)),
            hosts=tuple(hosts) if hosts is not None else None, key_id=row.key_id, created_by=row.created_by,
            updated_at=row.updated_at, last_used_at=row.last_used_at))
    return views


def preferred(rows: list[SecretRow]) -> SecretRow:
    """Of the rows of one name an agent may use, the one tools use: its own before a shared one."""
    return min(rows, key=lambda row: row.scope != "agent")


def secret_label(row: SecretRow) -> str:
    """How errors and operators name a stored row (never its value)."""
    return f"credential {row.name!r} ({row.scope} scope{', agent ' + row.agent if row.agent else ''})"


def secret_context(row: SecretRow) -> str:
    """The associated data a row is sealed with: the row itself (aad_version 2), so a blob copied to another
    row does not open; rows sealed before revision 0007 bind only their name."""
    if row.aad_version == ROW_AAD and row.id is not None:
        return row_context(row.name, row.scope, row.agent, row.id)
    if row.aad_version == LEGACY_AAD:
        return row.name
    raise VaultError(f"{secret_label(row)} has an unknown aad_version {row.aad_version}")


def open_secret(keys: KeyRing, row: SecretRow) -> str:
    """The plaintext of a stored row."""
    return keys.open(Sealed(row.key_id, row.ciphertext), secret_context(row), label=secret_label(row))


@dataclass(frozen=True)
class CredentialUse:
    """A credential opened for one request: its headers, and the hosts it may go to (None: anywhere)."""

    headers: dict[str, str]
    hosts: tuple[str, ...] | None

    def allows(self, host: str) -> bool:
        """Exact host (any case, no final dot); ``*.example.com`` matches any name below example.com."""
        if self.hosts is None:
            return True
        return host_allowed(host, self.hosts)
