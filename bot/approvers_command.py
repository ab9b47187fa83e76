"""``bot approvers enroll|list|revoke``: approvers' passkeys for ``step_up`` rules (SPEC §17). ``enroll`` prints a
one-time link (24 hours) the person opens to register a passkey; it is printed for the operator to hand over
privately, and never logged."""

from __future__ import annotations

import argparse

from bot.errors import DB_HINT, BotError, Failed
from bot.home import secure_home
from bot.operator import operator_name
from bot.passkeys_config import build_passkeys
from bot.people import is_person, people
from bot.settings import load_settings
from core.clock import SystemClock
from core.errors import NotFound, StoreError
from core.people import REQUESTER
from core.store import Database


def approver(entry: str) -> str:
    """The person ``entry`` names, with their channel (``slack:U1``, ``web:web``); one person only."""
    qualified = people().qualified(entry.strip())
    ident = qualified.rpartition(":")[2]
    if entry.strip() == REQUESTER or ":" not in qualified or not is_person(entry.strip()) or ident.startswith("S") \
            or qualified.startswith("oncall:"):
        raise BotError(f"{entry!r} is not one person: give a user id (U…), slack:U…, web, or <channel>:<id>")
    return qualified


async def approvers_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    secure_home(settings)
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        passkeys = build_passkeys(settings.bot_public_url, (), db, SystemClock())
        if passkeys is None:
            raise BotError("passkeys need BOT_PUBLIC_URL with a host name, over https (or http://localhost): "
                           "it is where the enrolment page is")
        if args.verb == "enroll":
            owner = approver(args.user)
            url, expires = await passkeys.enrol_link(owner, by=operator_name())
            print(f"One-time link to enrol a passkey for {owner} (until {expires:%Y-%m-%d %H:%M} UTC; give it to "
                  f"that person only):\n{url}")
            return 0
        if args.verb == "revoke":
            gone = await passkeys.revoke(args.id, by=operator_name())
            if gone is None:
                raise NotFound(f"There is no active passkey {args.id}.")
            print(f"passkey {gone.id} of {gone.owner} revoked")
            return 0
        rows = await passkeys.listed()
        if not rows:
            print("no passkeys enrolled")
        for row in rows:
            used = f"{row.last_used_at:%Y-%m-%d %H:%M:%S}Z" if row.last_used_at else "never used"
            print(f"{row.id}\t{row.owner}\tenrolled {row.created_at:%Y-%m-%d %H:%M:%S}Z\t{used}")
        return 0
    except StoreError as exc:
        raise Failed(f"{exc}; {DB_HINT}") from exc
    finally:
        await db.close()
