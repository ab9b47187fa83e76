"""Operator commands that act on the database directly (every running process sees the result)."""

from __future__ import annotations

import argparse
import getpass
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bot.agents_config import load_agents
from bot.errors import BotError
from bot.settings import load_settings
from core.agents import AgentDirectory
from core.approvals import ApprovalBroker, ApprovalPolicy
from core.clock import SystemClock
from core.errors import StoreError
from core.events import EventBus
from core.store import ApprovalStore, Database


@asynccontextmanager
async def _broker() -> AsyncIterator[ApprovalBroker]:
    settings = load_settings()
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        agents = AgentDirectory(load_agents(settings.bot_config, default_instructions=settings.bot_instructions))
        yield ApprovalBroker(ApprovalStore(db), EventBus(), SystemClock(),
                             ApprovalPolicy(settings.approvers, settings.admins), agents,
                             timeout_s=settings.approval_timeout_s)
    except StoreError as exc:
        raise BotError(str(exc)) from exc
    finally:
        await db.close()


def operator_name() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except (KeyError, OSError):
        return "operator"


async def approvals_command(args: argparse.Namespace) -> int:
    async with _broker() as broker:
        if args.verb == "list":
            pending = await broker.pending()
            if not pending:
                print("no pending approval requests")
            for p in pending:
                print(f"{p.id}\t{p.tool}\t{p.session.id}\tasked by {p.requester}"
                      f"\texpires {p.expires_at:%Y-%m-%d %H:%M} UTC\t{p.arguments}")
            return 0
        if args.verb in ("approve", "deny"):
            result = await broker.decide(args.id, args.verb, by=operator_name(),
                                         reason=getattr(args, "reason", None), operator=True)
            print(result.message)
            return 0 if result.won else 1
        if args.verb == "grants":
            grants = await broker.grants()
            if not grants:
                print("no active grants")
            for g in grants:
                print(f"{g.id}\tagent {g.agent}\ttool {g.tool}\tplace {g.place or '-'}\tpattern {g.arg_pattern or '*'}"
                      f"\tby {g.created_by} at {g.created_at:%Y-%m-%d %H:%M} UTC")
            return 0
        if args.verb == "revoke":
            message = await broker.revoke_grant(args.id, by=operator_name(), operator=True)
            print(message)
            return 0 if "revoked" in message else 1
    return 2
