"""The ``bot`` command line."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import re
import signal
import sys
from typing import TYPE_CHECKING

from bot import __version__
from bot.errors import DB_HINT, BotError, Exit, Failed
from channels.slack.manifest import render_manifest
from core.errors import CoreError

if TYPE_CHECKING:
    from bot.app import Application
    from bot.settings import Settings

log = logging.getLogger("bot")


def _id(text: str) -> int:
    """An id as people type it: ASCII digits, no larger than the database holds."""
    from core.text import parse_id

    value = parse_id(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a number such as 12)")
    return value


EXIT_CODES = """\
exit codes:
  0    done
  1    failed: it could not be done now (database unreachable, port in use...),
       or `bot doctor` found a problem; fix the cause and try again
  2    usage: bad arguments or invalid settings (environment, .env, bot.toml)
  3    not found: no such request, grant, credential, schedule, event or memory
  4    refused: not allowed, or its state does not allow it (already decided,
       expired, cancelled)
  130  interrupted (Ctrl-C)

Errors go to stderr as `bot: error: <what>; <what to do>`. Settings come from
the environment and .env (see .env.example); `bot <command> --help` says more.
"""

# Where to look after "not found", per command.
_LIST_HINT = {
    "approvals": "`bot approvals list` shows pending requests, `bot approvals grants` the grants",
    "credentials": "`bot credentials list` shows them",
    "schedules": "`bot schedules list` shows them",
    "events": "`bot events list` shows them",
    "memory": "`bot memory list` shows them",
    "approvers": "`bot approvers list` shows the passkeys",
}


def _command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str,
             details: str = "") -> argparse.ArgumentParser:
    """A subcommand whose --help opens with the same line as its entry in the parent's list."""
    return sub.add_parser(name, help=summary, description=f"{summary[:1].upper()}{summary[1:]}. {details}".strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bot", description="Chat-ops agent gateway (Slack first).",
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"bot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")
    _command(sub, "run", "start the gateway and serve until SIGTERM or Ctrl-C",
             "Slack HTTP mode with SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET, Socket Mode with SLACK_APP_TOKEN, "
             "otherwise only the web chat (at http://HOST:PORT/). Without LLM_* settings the offline demo agent "
             "answers.")
    _command(sub, "doctor", "check settings, database, keys, Slack and the model; say what to fix",
             "Exit code 1 when something is wrong.")
    _command(sub, "migrate", "bring the database to the current schema, then exit",
             "Safe to run twice, and from several replicas (or an init container) at once: on PostgreSQL one "
             "migrates while the others wait, then find nothing to do. `bot run` does the same at start. A database "
             "that a newer version of the bot migrated is left as it is (exit code 1).")
    manifest = _command(sub, "manifest", "print the Slack app manifest (YAML) to create the app from",
                        "The same files are in manifests/.")
    manifest.add_argument("--mode", choices=["socket", "http"], default="http",
                          help="http: Slack calls https://<host>/slack/events; socket: the bot opens a WebSocket "
                               "to Slack, no public URL needed (default: %(default)s)")
    manifest.add_argument("--distribution", action="store_true",
                          help="the multi-workspace app (SLACK_CLIENT_ID/SECRET): installs through /slack/install, "
                               "with oauth_config.redirect_urls (HTTP mode)")
    manifest.add_argument("--oncall", action="store_true",
                          help="approvers name oncall:<PagerDuty schedule id>: add users:read.email (people on call "
                               "are found by e-mail)")
    _command(sub, "pause", "stop taking new requests (accepted work continues); every replica sees it",
             "New messages get a 'paused' reply until `bot resume`.")
    _command(sub, "resume", "take new requests again")
    freeze = _command(sub, "freeze", "a change freeze: calls that need approval are refused until TIME (audited)",
                      "Every replica honours it at once; rules with during_freeze = \"ask\" ask admins instead.")
    freeze.add_argument("--until", required=True, metavar="TIME",
                        help="ISO 8601 with a timezone (2026-12-24T18:00Z) or a span from now (2h, 30m, 1d)")
    freeze.add_argument("--reason", required=True, metavar="TEXT", help="why: every refused call is told it")
    _command(sub, "unfreeze", "lift the stored freezes (a [[freezes]] window of bot.toml stays)")
    approvals = _command(sub, "approvals", "pending approvals and grants; operator overrides (audited)")
    verbs = approvals.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    _command(verbs, "list", "pending approval requests, their whole arguments and expiry")
    request_id = "the request's id (from `bot approvals list`)"
    _command(verbs, "approve", "approve a pending request: the call runs once").add_argument(
        "id", type=_id, help=request_id)
    deny = _command(verbs, "deny", "deny a pending request: the model is told, and the turn goes on")
    deny.add_argument("id", type=_id, help=request_id)
    deny.add_argument("--reason", default=None, help="why, told to the model (default: no reason)")
    _command(verbs, "grants", "every grant (Always allow, Allow in this thread): the exact call it covers, its "
             "scope, expiry and whether it was revoked")
    _command(verbs, "revoke", "revoke a grant: that call needs approval again").add_argument(
        "id", type=_id, help="the grant's id (from `bot approvals grants`)")
    creds = _command(sub, "credentials", "stored credentials (values are never printed)")
    cverbs = creds.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    name = "the credential's name, e.g. github.token (shell_run sees it as GITHUB_TOKEN)"
    _command(cverbs, "list", "names, scopes, allowed hosts, key ids, who stored them, last use")
    cset = _command(cverbs, "set", "store a value read from stdin or a hidden prompt (never from arguments)",
                    "An existing value of that name and scope is replaced.")
    cset.add_argument("name", help=name)
    cset.add_argument("--scope", choices=["agent", "shared"], default="agent",
                      help="agent: owned by the agent --agent names; shared: one value other agents can be granted, "
                           "granted here to --agent (default: %(default)s)")
    cset.add_argument("--agent", default=None,
                      help="the owning agent (scope agent) or the agent granted (shared) (default: the default agent)")
    cset.add_argument("--host", action="append", default=None, metavar="HOST",
                      help="where it may be sent (repeat for several; api.github.com, *.example.com, an IP); "
                           "default: any host")
    _command(cverbs, "delete", "delete a credential (every scope of that name)").add_argument("name", help=name)
    _command(cverbs, "rotate", "re-seal every sealed value (credentials, connections, Slack installs) under the "
             "first key in BOT_SECRET_KEYS", "Safe to interrupt; a second run does nothing. `bot doctor` names what is "
             "still under another key.")
    _command(cverbs, "link", "print a one-time link (15 min) to answer a pending credential request").add_argument(
        "request_id", type=_id, help="the credential request's id (shown with the request in the thread)")
    conns = _command(sub, "connections", "OAuth accounts connected through [[connections]] (tokens never printed)")
    overbs = conns.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    _command(overbs, "list", "who connected what: scopes, expiry, last use").add_argument(
        "--user", default=None, help="only this person's (a Slack user id, or web)")
    cdis = _command(overbs, "disconnect", "revoke the token at the provider (RFC 7009), then delete it here",
                    "If the provider refuses the revocation nothing is deleted, unless --force.")
    cdis.add_argument("name", help="the connection's name in bot.toml, e.g. github")
    cdis.add_argument("--user", default=None, help="whose account (needed unless the connection is shared)")
    cdis.add_argument("--force", action="store_true", help="delete here even if the provider refuses to revoke")
    scheds = _command(sub, "schedules", "scheduled sessions (operator actions are audited by name)")
    sverbs = scheds.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    _command(sverbs, "list", "every schedule, its status and last outcome")
    for verb, effect in (("pause", "no firings until resumed"), ("resume", "fire again on its trigger"),
                         ("cancel", "for good")):
        _command(sverbs, verb, f"{verb} a schedule: {effect}", "The running bot follows within seconds.").add_argument(
            "id", type=_id, help="the schedule's id (from `bot schedules list`)")
    events = _command(sub, "events", "deliveries of the [[event_sources]] (POST /events/<name>) and their answers")
    everbs = events.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    elist = _command(everbs, "list", "the newest events: id, source, type, delivery id, when, status, thread",
                     "Statuses: queued, answered, failed, filtered, duplicate.")
    elist.add_argument("--source", default=None, help="only this source's events (its name in bot.toml)")
    elist.add_argument("--limit", type=_id, default=50, help="how many to list (default: %(default)s)")
    _command(everbs, "replay", "run an event again as a new turn, in the thread its key names",
             "The running bot takes it within seconds (or at its next start).").add_argument(
        "id", type=_id, help="the event's id (from `bot events list`)")
    memory = _command(sub, "memory", "what the agents remember across their threads (remember / recall / forget)")
    mverbs = memory.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    mlist = _command(mverbs, "list", "the newest memories: id, agent, pinned, proposed, who, when, thread, the text",
                     "Pinned ones are in every turn's system prompt; proposed ones came from the memory pass.")
    mlist.add_argument("--agent", default=None, help="only this agent's memories (its name in bot.toml)")
    mlist.add_argument("--limit", type=_id, default=200, help="how many to list (default: %(default)s)")
    _command(mverbs, "forget", "delete a memory (audited); the agents no longer see it").add_argument(
        "id", type=_id, help="the memory's id (from `bot memory list`)")
    feedback = _command(sub, "feedback", "what people said of the answers (the buttons under each answer)")
    fverbs = feedback.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    flist = _command(fverbs, "list", "the newest verdicts: when, positive or negative, which turn, who, where",
                     "The first line totals every person's latest verdict.")
    flist.add_argument("--limit", type=_id, default=50, help="how many to list (default: %(default)s)")
    usage = _command(sub, "usage", "what the model calls used, by UTC day, agent and person (tokens, cost)",
                     "Cost is priced by [[prices]] in bot.toml; calls of a model without a price are counted apart.")
    usage.add_argument("--days", type=_id, default=7, help="this many UTC days, today included (default: %(default)s)")
    usage.add_argument("--agent", default=None, help="only this agent (its name in bot.toml)")
    usage.add_argument("--person", default=None, help="only this person (a user id; 'nobody' for events' turns)")
    audit = _command(sub, "audit", "the audit trail: approvals, votes, grants, credentials, schedules, overrides")
    averbs = audit.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    export = _command(averbs, "export", "write every audit event since a date to stdout",
                      "Each row: at, who, what, subject, where, outcome, detail. Never a secret value.")
    export.add_argument("--since", required=True, help="a date (2026-11-30) or time (2026-11-30T12:00:00Z), UTC")
    export.add_argument("--until", default=None, help="up to (not including) this date or time (default: now)")
    export.add_argument("--format", choices=["jsonl", "csv"], default="jsonl", help="(default: %(default)s)")
    policies = _command(sub, "policies", "approval rules ([[policies]] in bot.toml)")
    pverbs = policies.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    pcheck = _command(pverbs, "check", "say which rule decides a call, and why (a dry run: nothing runs)",
                      "TEXT is what rules match: shell_run's command, http_request's 'METHOD URL', "
                      "message_send's '#channel text', another tool's arguments as JSON.")
    pcheck.add_argument("tool", help="the tool's name, e.g. shell_run")
    pcheck.add_argument("text", help="the call's text, e.g. 'echo hello'")
    pcheck.add_argument("--risk", choices=["gated", "safe"], default=None,
                        help="the tool's built-in risk (default: known for built-in tools, else gated)")
    pcheck.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                        help="a header the http_request call sends (repeatable)")
    pcheck.add_argument("--body", default=None, help="the body the http_request call sends")
    skills = _command(sub, "skills", "the skills of SKILLS_DIR and the built-in one, each with its status",
                      "Available, unavailable (and why: a tool the agent lacks, a credential not stored) or "
                      "malformed (path:line), for each agent of bot.toml.")
    skverbs = skills.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    _command(skverbs, "list", "each skill, its status for each agent, and every malformed skill file").add_argument(
        "--agent", default=None, help="only this agent's view (its name in bot.toml)")
    config = _command(sub, "config", "print the JSON Schema of bot.toml (BOT_CONFIG), or check the file")
    cfverbs = config.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    _command(cfverbs, "schema", "print the JSON Schema of bot.toml (every table and key), for editors")
    ccheck = _command(cfverbs, "check", "check bot.toml as `bot run` would, and say what it holds",
                      "Exit code 2 and the key's path when something is wrong.")
    ccheck.add_argument("--config", default=None, metavar="PATH", help="the file (default: BOT_CONFIG, bot.toml)")
    appr = _command(sub, "approvers", "approvers' passkeys, for rules with step_up (needs BOT_PUBLIC_URL)")
    apverbs = appr.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    _command(apverbs, "enroll", "print a one-time link (24 h) on which USER registers a passkey",
             "Re-enrolling adds a passkey; give the link to that person only.").add_argument(
        "user", help="the person, as approvers name them: a Slack user id (U…), slack:U…, or web")
    _command(apverbs, "list", "enrolled passkeys: id, owner, when enrolled, last use")
    _command(apverbs, "revoke", "revoke a passkey: it confirms nothing any more").add_argument(
        "id", type=_id, help="the passkey's id (from `bot approvers list`)")
    webp = _command(sub, "web", "web chat logins")
    wverbs = webp.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of:")
    _command(wverbs, "logout-all", "end every web chat login (audited); browsers get the login page again")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except (BotError, CoreError) as exc:
        code = _exit_code(exc)
        hint = _LIST_HINT.get(args.command) if code == Exit.NOT_FOUND and not isinstance(exc, BotError) else None
        error(str(exc), hint)
        return code


def _exit_code(exc: BotError | CoreError) -> Exit:
    from core.errors import InvalidInput, NotFound, VaultError

    if isinstance(exc, BotError):
        return exc.exit_code
    if isinstance(exc, NotFound):
        return Exit.NOT_FOUND
    if isinstance(exc, InvalidInput):  # NotAllowed, Conflict, and any other refusal of what was asked
        return Exit.REFUSED
    if isinstance(exc, VaultError):  # a key missing from BOT_SECRET_KEYS: settings
        return Exit.USAGE
    return Exit.FAILED  # the database, or core not available right now


def error(what: str, what_to_do: str | None = None) -> None:
    """The one way the CLI reports an error: one style, on stderr, with every known secret masked."""
    text = f"{what.rstrip('.')}; {what_to_do}" if what_to_do else what
    print(f"bot: error: {masked(text)}", file=sys.stderr)


# The user-info part of a URL (``scheme://user:password@``), up to its last "@": a password holding an
# unescaped "@" leaves its tail where the host should be.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)\S*@")


def masked(text: str) -> str:
    """``text`` with URL passwords and the configured secrets (tokens, keys, the database password) masked."""
    from bot.logs import RedactingFilter

    text = _URL_PASSWORD.sub(r"\1***@", text)
    return RedactingFilter(_known_secrets()).redact(text)


def _known_secrets() -> list[str]:
    from bot.settings import load_settings, secret_names

    try:
        return load_settings().secret_values()
    except BotError:  # settings that do not load: take the raw values from the environment
        # Whole values; the key list and the database URL are taken apart below.
        names = [n for n in secret_names() if n not in ("BOT_SECRET_KEYS", "DATABASE_URL")]
        values = [os.environ.get(n, "") for n in names]
        values += [key.rpartition(":")[2] for key in os.environ.get("BOT_SECRET_KEYS", "").split(",")]
        password = re.match(r"[^:/]*://[^:/@]*:(.*)@", os.environ.get("DATABASE_URL", ""))
        values.append(password.group(1) if password else "")
        return [v.strip() for v in values if len(v.strip()) >= 4]


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "manifest":
        if args.distribution and args.mode == "socket":
            sys.stderr.write("bot manifest: --distribution needs --mode http (multi-workspace apps use HTTP mode)\n")
            return 2
        sys.stdout.write(render_manifest(args.mode, distribution=args.distribution, oncall=args.oncall))
        return 0
    if args.command == "config":
        return _config(args.verb, args.config if args.verb == "check" else None)
    if args.command == "doctor":
        from bot.doctor import run_doctor

        return asyncio.run(run_doctor())
    if args.command == "migrate":
        return asyncio.run(_migrate())
    if args.command in ("pause", "resume"):
        return asyncio.run(_set_paused(args.command == "pause"))
    if args.command in ("freeze", "unfreeze"):
        from bot.operator import freeze_command

        return asyncio.run(freeze_command(args))
    if args.command == "approvals":
        from bot.operator import approvals_command

        return asyncio.run(approvals_command(args))
    if args.command == "web":
        return asyncio.run(_web_logout_all())
    if args.command == "approvers":
        from bot.approvers_command import approvers_command

        return asyncio.run(approvers_command(args))
    if args.command == "audit":
        from bot.operator import audit_command

        return asyncio.run(audit_command(args))
    if args.command == "policies":
        from bot.policy_check import check_command

        return check_command(args.tool, args.text, args.risk, args.header, args.body)
    if args.command == "usage":
        from bot.usage_command import usage_command

        return asyncio.run(usage_command(args))
    if args.command == "feedback":
        from bot.operator import feedback_command

        return asyncio.run(feedback_command(args))
    if args.command == "memory":
        from bot.operator import memory_command

        return asyncio.run(memory_command(args))
    if args.command == "events":
        from bot.operator import events_command

        return asyncio.run(events_command(args))
    if args.command == "skills":
        from bot.skills_command import skills_command

        return asyncio.run(skills_command(args))
    if args.command == "schedules":
        from bot.operator import schedules_command

        return asyncio.run(schedules_command(args))
    if args.command == "connections":
        from bot.connections_command import connections_command

        return asyncio.run(connections_command(args))
    if args.command == "credentials":
        from bot.operator import credentials_command, read_secret
        from core.hosts import parse_hosts

        problem = parse_hosts(args.host)[1] if args.verb == "set" else None
        if problem is not None:  # said before the value is typed
            raise BotError(problem)
        value = read_secret(args.name) if args.verb == "set" else None
        return asyncio.run(credentials_command(args, value))
    return asyncio.run(_run())


def _config(verb: str, path: str | None) -> int:
    import json
    from pathlib import Path

    from bot.config import file

    if verb == "schema":
        print(json.dumps(file.config_schema(), indent=2, ensure_ascii=False))
        return 0
    if path is None:
        from bot.settings import load_settings

        config = load_settings().bot_config
    else:
        config = Path(path)
    if not config.exists():
        print(f"bot: {config} does not exist: one default agent, no approval rules, connections or MCP servers")
        return 0
    toml = file.load_config(config)
    agents, policies, connections = toml.agent_list(None), toml.policy_list(), toml.connection_specs(config)
    servers, sections = toml.mcp_specs(), toml.sections()
    print(f"bot: {config} is valid: {len(agents)} agent(s), {len(policies)} approval rule(s), "
          f"{len(connections)} connection(s), {len(servers)} MCP server(s)"
          + "".join(f", [{name}]" for name in sections))
    return 0


async def _migrate() -> int:
    from bot.home import secure_home
    from bot.settings import load_settings
    from core.errors import StoreError
    from core.store import Database

    settings = load_settings()
    secure_home(settings)  # before the database file is opened (or created): 0700 folders, 0600 files
    db = Database(settings.resolved_database_url)
    try:
        change = await db.migrate()  # a schema newer than this code: SchemaTooNew, one line (main)
    except StoreError as exc:
        raise Failed(f"{exc}; {DB_HINT}") from exc
    finally:
        await db.close()
    after = ", ".join(change.after) or "none"
    if change.before == change.after:
        print(f"bot: {db.display_url} is at the current schema ({after}); nothing to do")
    elif not change.before:
        print(f"bot: created the schema ({after}) in {db.display_url}")
    else:
        print(f"bot: migrated {db.display_url} from schema {', '.join(change.before)} to {after}")
    return 0


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
        raise Failed(f"{exc}; {DB_HINT}") from exc
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
        raise Failed(f"{exc}; {DB_HINT}") from exc
    finally:
        await db.close()
    print("bot: intake paused: new messages get a 'paused' reply; accepted work continues" if paused
          else "bot: intake resumed")
    return 0


async def _run() -> int:
    from bot.app import build_application
    from bot.home import secure_home
    from bot.logs import configure_logging
    from bot.runlock import take_run_lock
    from bot.settings import load_settings
    from core.errors import StoreError

    settings = load_settings()
    redactor = configure_logging(settings.log_level, settings.log_format, settings.secret_values())
    secure_home(settings)
    take_run_lock(settings)  # SQLite: before anything reads, migrates or recovers; held until the process exits
    app = build_application(settings, secret_sink=redactor.add)
    # Before start: recovery resumes parked turns, and a SIGTERM or Ctrl-C meeting the default action
    # then would count as a crash (twice fails the turn). Start-up finishes, then the bot stops as usual.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()  # listens first: a busy port fails before anything is recovered
    except StoreError as exc:
        raise Failed(f"{exc}; {DB_HINT}") from exc
    # What start-up built (modules, settings, the app) lives as long as the process: kept out of the cycle
    # collector, whose full passes over it otherwise stop the loop for tens of ms (acks wait) under load.
    gc.collect()
    gc.freeze()
    # The SQLite writer's thread runs Python too: when it is busy, the loop waits for the GIL up to this
    # long on each wake-up (default 5 ms); 1 ms bounds what a burst of turn writes adds to an ack.
    sys.setswitchinterval(0.001)
    if not stop.is_set():
        _announce(settings, app)
        await stop.wait()
    log.info("shutting down (running turns get up to %.0f s; parked ones are kept as they are)",
             settings.shutdown_drain_s)
    stopped = await app.stop()
    # The lock is not released here: closing a descriptor of the database file would drop SQLite's own
    # locks of any connection still open in this process; the process's exit releases it.
    print(stopped.describe(), flush=True)
    return 0


def _announce(settings: Settings, app: Application) -> None:
    url = f"http://{settings.host}:{app.bound_port}"
    from bot.channels import installed_channels

    # The "listening on" line comes last: scripts wait for it.
    print(f"bot: model provider: {settings.provider}; database: {app.db.display_url}", flush=True)
    for plugin in installed_channels():
        for line in plugin.announce(settings.channels[plugin.name], url):
            print(line, flush=True)
    print(f"bot: listening on {url}  (health: {url}/healthz)", flush=True)
