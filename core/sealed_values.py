"""Every value sealed with the vault, listed in one place (SPEC §8): re-sealing them all under the current key
(``bot credentials rotate``) and naming those that are not under it, or that no key opens (``bot doctor``).

A table that stores a sealed value joins :func:`sealed_kinds`; rotation and the doctor then cover it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from core.clock import Clock
from core.connections.service import connection_label, seal_context
from core.errors import VaultError
from core.store.connection_tables import ConnectionRow
from core.store.connections import ConnectionStore
from core.store.credentials import CredentialStore
from core.store.database import Database
from core.store.tables import SecretRow
from core.stored_secrets import secret_context, secret_label
from core.vault import ROW_AAD, KeyRing, Sealed, row_context

log = logging.getLogger(__name__)

# A row another writer changes while rotation reads and re-seals it is read again; this many times at most.
_ATTEMPTS = 3


class SealedRow(Protocol):
    """What every table of sealed values has: its id, the key a value is sealed under, and the ciphertext."""

    id: int | None
    key_id: str
    ciphertext: str


R = TypeVar("R", bound=SealedRow)


@dataclass(frozen=True)
class SealedKind(Generic[R]):
    """One table of sealed values: how to list its rows, name one (never its value), what its ciphertext is bound
    to, and how to replace the ciphertext only while it is the one read (a writer meanwhile always wins)."""

    kind: str  # plural, as printed: "credentials"
    rows: Callable[[], Awaitable[Sequence[R]]]
    label: Callable[[R], str]
    context: Callable[[R], str]  # the associated data it is sealed with now
    bound: Callable[[R], str]  # the associated data it should be sealed with (differs only for old rows)
    replace: Callable[[R, Sealed, datetime], Awaitable[bool]]

    def current(self, row: R, keys: KeyRing) -> bool:
        return row.key_id == keys.current and self.context(row) == self.bound(row)


def _credentials(store: CredentialStore) -> SealedKind[SecretRow]:
    def bound(row: SecretRow) -> str:
        assert row.id is not None
        return row_context(row.name, row.scope, row.agent, row.id)

    async def replace(row: SecretRow, sealed: Sealed, now: datetime) -> bool:
        assert row.id is not None
        return await store.reseal(row.id, expected_ciphertext=row.ciphertext, key_id=sealed.key_id,
                                  ciphertext=sealed.blob, aad_version=ROW_AAD, now=now)

    return SealedKind("credentials", store.all_secrets, secret_label, secret_context, bound, replace)


def sealed_kinds(db: Database) -> list[SealedKind[Any]]:
    """Core's tables holding a sealed value: credentials and connected accounts' tokens (a channel adds its own:
    ``core.plugins.ChannelPlugin.sealed``)."""
    connections = ConnectionStore(db)

    def connection_context(row: ConnectionRow) -> str:
        assert row.id is not None
        return seal_context(row.name, row.owner, row.id)

    async def replace_connection(row: ConnectionRow, sealed: Sealed, now: datetime) -> bool:
        assert row.id is not None
        return await connections.reseal(row.id, expected_ciphertext=row.ciphertext, key_id=sealed.key_id,
                                        ciphertext=sealed.blob, now=now)

    return [
        _credentials(CredentialStore(db)),
        SealedKind("connections", connections.listed, connection_label, connection_context, connection_context,
                   replace_connection),
    ]


async def _reseal_row(kind: SealedKind[R], row: R, keys: KeyRing, now: datetime) -> bool:
    """Open one row and seal it again under the current key, bound to its row. False: it changed since it was
    read (or, for a connection, a refresh holds it), so nothing was written. VaultError: no key opens it."""
    plain = keys.open(Sealed(row.key_id, row.ciphertext), kind.context(row), label=kind.label(row))
    return await kind.replace(row, keys.seal(plain, kind.bound(row)), now)


async def bind_legacy_credentials(store: CredentialStore, keys: KeyRing, clock: Clock) -> int:
    """Bind credentials sealed before revision 0007 (name-only associated data) to their row, at start: one row
    per commit, each only if unchanged since read, so it is safe to run twice or on several replicas at once. A
    row whose key is missing stays as it is, with a warning. Returns how many were bound."""
    kind, bound = _credentials(store), 0
    for row in await store.all_secrets():
        if row.aad_version == ROW_AAD:
            continue
        try:
            if await _reseal_row(kind, row, keys, clock.now()):
                bound += 1
        except VaultError as exc:
            log.warning("%s; it is bound to its name only until that is fixed (then restart, or run "
                        "`bot credentials rotate`)", exc)
    if bound:
        log.info("bound %d credential(s) sealed before revision 0007 to their rows", bound)
    return bound


@dataclass
class Resealed:
    """What rotation did to one kind. ``unopened`` and ``busy`` name rows (never values) it had to leave."""

    kind: str
    resealed: int = 0
    current: int = 0  # already under the current key
    unopened: list[str] = field(default_factory=list)  # no configured key opens them: each with why
    busy: list[str] = field(default_factory=list)  # kept changing while rotation ran (a refresh): run it again

    def summary(self, key_id: str) -> str:
        text = f"{self.kind}: {self.resealed} re-sealed, {self.current} already under key {key_id!r}"
        if self.unopened:
            text += f", {len(self.unopened)} that no configured key opens"
        if self.busy:
            text += f", {len(self.busy)} changing meanwhile (left as they are)"
        return text


async def reseal_all(kinds: Sequence[SealedKind[Any]], keys: KeyRing, clock: Clock,
                     progress: Callable[[str], None]) -> list[Resealed]:
    """Re-seal every row not under the current key (or not yet bound to its row), one commit per row: safe to
    interrupt, and a second run finds nothing to do. A row that no key opens is named and passed over."""
    return [await _reseal_kind(kind, keys, clock, progress) for kind in kinds]


async def _reseal_kind(kind: SealedKind[Any], keys: KeyRing, clock: Clock,
                       progress: Callable[[str], None]) -> Resealed:
    report = Resealed(kind.kind)
    wanted: set[int] | None = None  # every row on the first pass; then only those another writer changed
    changed: dict[int, str] = {}
    for _attempt in range(_ATTEMPTS):
        changed = {}
        for row in await kind.rows():
            if wanted is not None and row.id not in wanted:
                continue
            try:
                if kind.current(row, keys):
                    report.current += 1
                    continue
                done = await _reseal_row(kind, row, keys, clock.now())
            except VaultError as exc:  # no configured key opens it (or its binding is unknown)
                report.unopened.append(str(exc))
                progress(f"not re-sealed: {exc}")
                continue
            if not done:
                changed[row.id] = kind.label(row)
                continue
            report.resealed += 1
            bound = " and bound it to its row" if kind.context(row) != kind.bound(row) else ""
            progress(f"re-sealed {kind.label(row)} from key {row.key_id!r} to {keys.current!r}{bound}")
        if not changed:
            break
        wanted = set(changed)
    report.busy = list(changed.values())
    for label in report.busy:
        progress(f"not re-sealed: {label} kept changing while this ran (a refresh in flight?); run it again")
    return report


@dataclass(frozen=True)
class Unsettled:
    """A row the doctor names: under a key that is not the current one, or opened by no configured key."""

    label: str  # names the kind and the row, e.g. "connection 'github' (U1)"
    key_id: str
    problem: str | None = None  # why no key opens it; None: it opens


async def unsettled(kinds: Sequence[SealedKind[Any]], keys: KeyRing) -> tuple[int, list[Unsettled]]:
    """Every sealed row that is not under the current key or does not open (each opened once to tell), and how
    many rows there are in all."""
    count, found = 0, []
    for kind in kinds:
        for row in await kind.rows():
            count += 1
            try:
                keys.open(Sealed(row.key_id, row.ciphertext), kind.context(row), label=kind.label(row))
            except VaultError as exc:
                found.append(Unsettled(kind.label(row), row.key_id, str(exc)))
                continue
            if not kind.current(row, keys):
                found.append(Unsettled(kind.label(row), row.key_id))
    return count, found
