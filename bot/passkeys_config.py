"""Passkeys from settings (SPEC §17 ``step_up``): the relying party is BOT_PUBLIC_URL. A ``step_up`` rule without a
usable BOT_PUBLIC_URL stops the start with one line; without such a rule, a usable one still allows enrolling."""

from __future__ import annotations

from collections.abc import Iterable

from bot.errors import SettingsError
from core.clock import Clock
from core.passkeys import Passkeys, relying_party
from core.policies import Policy
from core.store.database import Database
from core.store.passkeys import PasskeyStore


def build_passkeys(public_url: str | None, policies: Iterable[Policy], db: Database, clock: Clock) -> Passkeys | None:
    rp = relying_party(public_url)
    if isinstance(rp, str):
        stepping = [p for p in policies if p.step_up]
        if stepping:
            raise SettingsError(f"{stepping[0].describe()} has step_up = true, but {rp}")
        return None
    return Passkeys(PasskeyStore(db), clock, rp)
