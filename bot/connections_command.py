"""``bot connections list|disconnect NAME``: connected accounts, as an operator sees them (never a token)."""

from __future__ import annotations

import argparse

from bot.config.file import load_connections
from bot.errors import DB_HINT, BotError, Failed, NotFoundError, Refused
from bot.home import secure_home
from bot.keys import load_keyring
from bot.oauth_client import HttpOAuthClient
from bot.operator import operator_name
from bot.people import people
from bot.settings import load_settings
from core.approval_policy import ApprovalPolicy
from core.clock import SystemClock
from core.connections.service import ConnectionService
from core.errors import InvalidInput, NotFound, StoreError, VaultError
from core.events import EventBus
from core.store import Database
from core.store.connections import ConnectionStore


async def connections_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    specs = load_connections(settings.bot_config)
    secure_home(settings)
    db = Database(settings.resolved_database_url)
    clock = SystemClock()
    try:
        await db.migrate()
        service = ConnectionService(specs, ConnectionStore(db), load_keyring(settings), HttpOAuthClient(clock.now),
                                    EventBus(), clock,
                                    ApprovalPolicy(settings.approvers, settings.admins, people=people()))
        if args.verb == "list":
            views = await service.views(args.user) if args.user else await service.views()
            if not views:
                print("no connected accounts" + (f" of {args.user}" if args.user else ""))
            for view in views:
                print(f"{view.name}\t{view.owner or '(shared)'}\t{view.describe()}\tconnected by {view.connected_by}")
            missing = sorted(set(specs) - {v.name for v in views})
            if missing and not args.user:
                print(f"configured, nobody connected: {', '.join(missing)}")
            return 0
        spec = specs.get(args.name)
        if spec is None:
            raise NotFoundError(f"no connection named {args.name!r} in {settings.bot_config} "
                                f"(configured: {', '.join(sorted(specs)) or 'none'})")
        if spec.owner == "user" and not args.user:
            raise BotError(f"{args.name} connects each person's own account: name whose with --user U…")
        try:
            print(await service.disconnect(args.name, args.user or "", by=operator_name(), force=args.force))
        except NotFound as exc:
            raise NotFoundError(str(exc)) from None
        except InvalidInput as exc:
            raise Refused(str(exc)) from None
        return 0
    except StoreError as exc:
        raise Failed(f"{exc}; {DB_HINT}") from exc
    except VaultError as exc:
        raise BotError(str(exc)) from exc
    finally:
        await db.close()
