"""The ``bot`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from bot import __version__
from bot.errors import BotError
from bot.manifest import render_manifest

log = logging.getLogger("bot")


def _id(text: str) -> int:
    """An id as people type it: ASCII digits, no larger than the database holds."""
    from core.text import parse_id

    value = parse_id(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a number such as 12)")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bot", description="Chat-ops agent gateway (Slack first).")
    parser.add_argument("--version", action="version", version=f"bot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="start the gateway")
    sub.add_parser("doctor", help="check settings, database, keys, Slack and the model; say what to fix")
    manifest = sub.add_parser("manifest", help="print the Slack app manifest")
    manifest.add_argument("--mode", choices=["socket", "http"], default="http")
    sub.add_parser("pause", help="stop taking new requests (accepted work continues); every replica sees it")
    sub.add_parser("resume", help="take new requests again")
    approvals = sub.add_parser("approvals", help="pending approvals and grants; operator overrides (audited)")
    verbs = approvals.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="pending approval requests")
    approve = verbs.add_parser("approve", help="approve a pending request")
    approve.add_argument("id", type=_id)
    deny = verbs.add_parser("deny", help="deny a pending request")
    deny.add_argument("id", type=_id)
    deny.add_argument("--reason", default=None)
    verbs.add_parser("grants", help="active \"Always allow\" grants")
    revoke = verbs.add_parser("revoke", help="revoke a grant")
    revoke.add_argument("id", type=_id)
    creds = sub.add_parser("credentials", help="stored credentials (values are never printed)")
    cverbs = creds.add_subparsers(dest="verb", required=True)
    cverbs.add_parser("list", help="names, scopes, allowed hosts, key ids, who stored them, last use")
    cset = cverbs.add_parser("set", help="store a value read from stdin or a hidden prompt (never from arguments)")
    cset.add_argument("name")
    cset.add_argument("--scope", choices=["agent", "shared"], default="agent")
    cset.add_argument("--agent", default=None, help="the owning agent (scope agent) or the agent granted (shared)")
    cset.add_argument("--host", action="append", default=None, metavar="HOST",
                      help="where it may be sent (repeat for several; api.github.com, *.example.com, an IP); "
                           "default: any host")
    cdel = cverbs.add_parser("delete", help="delete a credential (every scope of that name)")
    cdel.add_argument("name")
    cverbs.add_parser("rotate", help="re-seal every credential under the first key in BOT_SECRET_KEYS")
    clink = cverbs.add_parser("link", help="print a one-time link (15 min) to answer a pending credential request")
    clink.add_argument("request_id", type=_id)
    scheds = sub.add_parser("schedules", help="scheduled sessions (operator actions are audited by name)")
    sverbs = scheds.add_subparsers(dest="verb", required=True)
    sverbs.add_parser("list", help="every schedule, its status and last outcome")
    for verb in ("pause", "resume", "cancel"):
        one = sverbs.add_parser(verb, help=f"{verb} a schedule")
        one.add_argument("id", type=_id)
    webp = sub.add_parser("web", help="web chat logins")
    wverbs = webp.add_subparsers(dest="verb", required=True)
    wverbs.add_parser("logout-all", help="end every web chat login (audited); browsers get the login page again")
    args = parser.parse_args(argv)

    if args.command == "manifest":
        sys.stdout.write(render_manifest(args.mode))
        return 0
    try:
        if args.command == "doctor":
            from bot.doctor import run_doctor

            return asyncio.run(run_doctor())
        if args.command in ("pause", "resume"):
            return asyncio.run(_set_paused(args.command == "pause"))
        if args.command == "approvals":
            from bot.operator import approvals_command

            return asyncio.run(approvals_command(args))
        if args.command == "web":
            return asyncio.run(_web_logout_all())
        if args.command == "schedules":
            from bot.operator import schedules_command

            return asyncio.run(schedules_command(args))
        if args.command == "credentials":
            from bot.operator import credentials_command, read_secret
            from core.hosts import parse_hosts

            problem = parse_hosts(args.host)[1] if args.verb == "set" else None
            if problem is not None:  # said before the value is typed
                raise BotError(problem)
            value = read_secret(args.name) if args.verb == "set" else None
            return asyncio.run(credentials_command(args, value))
        return asyncio.run(_run())
    except BotError as exc:
        print(f"bot: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


async def _web_logout_all() -> int:
    from bot.operator import operator_name
    from bot.settings import load_settings
    from core.clock import SystemClock
    from core.errors import StoreError
    from core.store import Database, WebSessionStore

    settings = load_settings()
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        count = await WebSessionStore(db).revoke_all(operator_name(), SystemClock().now())
    except StoreError as exc:
        raise BotError(str(exc)) from exc
    finally:
        await db.close()
    print(f"bot: ended {count} web chat login{'' if count == 1 else 's'}; "
          "browsers get the login page on their next request")
    return 0


async def _set_paused(paused: bool) -> int:
    from bot.home import secure_home
    from bot.settings import load_settings
    from core.clock import SystemClock
    from core.errors import StoreError
    from core.store import ControlStore, Database

    settings = load_settings()
    secure_home(settings)
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        await ControlStore(db).set_intake_paused(paused, SystemClock().now())
    except StoreError as exc:
        raise BotError(str(exc)) from exc
    finally:
        await db.close()
    print("bot: intake paused: new messages get a 'paused' reply; accepted work continues" if paused
          else "bot: intake resumed")
    return 0


async def _run() -> int:
    from bot.app import build_application
    from bot.logs import configure_logging
    from bot.settings import load_settings
    from core.errors import StoreError

    settings = load_settings()
    redactor = configure_logging(settings.log_level, settings.log_format, settings.secret_values())
    app = build_application(settings, secret_sink=redactor.add)
    try:
        await app.start()
    except StoreError as exc:
        raise BotError(str(exc)) from exc
    except OSError as exc:
        await app.stop()
        raise BotError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from exc

    url = f"http://{settings.host}:{app.bound_port}"
    # The "listening on" line comes last: scripts wait for it.
    if settings.slack_mode == "http":
        print(f"bot: Slack HTTP mode — point the app's request URL at {url}/slack/events", flush=True)
    elif settings.slack_mode == "socket":
        print("bot: Slack Socket Mode connected", flush=True)
    else:
        print("bot: no Slack settings; set SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET (or SLACK_APP_TOKEN) "
              "to connect Slack", flush=True)
    print(f"bot: model provider: {settings.provider}; database: {app.db.display_url}", flush=True)
    if settings.bot_web_chat:
        login = " (log in with BOT_WEB_TOKEN)" if settings.bot_web_token else ""
        print(f"bot: web chat: {url}/{login}", flush=True)
    print(f"bot: listening on {url}  (health: {url}/healthz)", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down (draining up to %.0f s)", settings.shutdown_drain_s)
    await app.stop()
    return 0
