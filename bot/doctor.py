"""``bot doctor``: check settings, database, keys, Slack and the model; say what to fix."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from bot.channels import installed_channels
from bot.errors import BotError
from bot.settings import Settings, load_settings
from core.plugins import Check, DoctorContext

if TYPE_CHECKING:
    from bot.config.file import BotToml
    from bot.model_endpoints import ModelEndpoint


async def run_doctor() -> int:
    try:
        settings = load_settings()
    except BotError as exc:
        print(f"✗ settings: {exc}\n  fix: correct the variables above in the environment or .env")
        return 1
    enabled = [plugin.name for plugin in installed_channels() if settings.channels[plugin.name].enabled]
    checks = [Check("settings", True, f"valid (channels: {', '.join(enabled) or 'none'}, model: {settings.provider})")]
    checks += _config_file(settings)
    checks += await _database(settings)
    checks += await _deliveries(settings)
    checks += await _keys(settings)
    checks += _trust_boundary(settings)
    checks += _skills(settings)
    checks += await _mcp_servers(settings)
    checks += await _event_sources(settings)
    checks += await _oncall(settings)
    context = doctor_context(settings)
    for plugin in installed_channels():
        checks += await plugin.checks(settings.channels[plugin.name], context)
    for name, endpoint in _models(settings):  # the primary, then the fallback (LLM_FALLBACK_*), if set
        if endpoint.provider == "openai":
            checks.append(await openai_model_check(endpoint.base_url, endpoint.api_key, endpoint.model, timeout_s=10,
                                                   name=name, where=endpoint.names))
        if endpoint.provider == "anthropic":
            checks.append(await _anthropic_model(settings, endpoint, name))
    failed = False
    for check in checks:
        mark = "✓" if check.ok and not check.warning else ("!" if check.ok else "✗")
        print(f"{mark} {check.name}: {_printable(check.detail)}")
        if check.fix:
            print(f"  fix: {_printable(check.fix)}")
        failed = failed or not check.ok
    print("everything looks right" if not failed else "some checks failed (see the fixes above)")
    sys.stdout.flush()
    return 1 if failed else 0


def _printable(text: str) -> str:
    """A check's text as the terminal gets it: one line, no control character. Much of it is others' words (a model
    endpoint's or an MCP server's error), and an escape sequence there could write the clipboard (OSC 52), clear the
    screen, or rewrite a line into a passing one (a carriage return)."""
    return "".join(c if c.isprintable() else " " if c in "\n\r\t" else "" for c in text)


def doctor_context(settings: Settings) -> DoctorContext:
    """What a channel's checks are given: the database, and the vault's keys (or why they do not load)."""
    from bot.keys import load_keyring
    from core.vault import KeyRing

    def keys() -> KeyRing | str:
        try:
            return load_keyring(settings)
        except BotError as exc:
            return str(exc)

    return DoctorContext(settings.resolved_database_url, keys)


async def _database(settings: Settings) -> list[Check]:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from core.errors import StoreError
    from core.store import Database
    from core.store.database import MIGRATIONS_DIR, newer_schema

    try:
        db = Database(settings.resolved_database_url)
    except StoreError as exc:
        return [Check("database", False, str(exc), "set DATABASE_URL to a sqlite:/// or postgresql:// URL")]
    try:
        async with db.engine.connect() as conn:
            try:
                current = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
            except Exception:
                current = None
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        script = ScriptDirectory.from_config(cfg)
        head = script.get_current_head()
        if current == head:
            return [Check("database", True, f"{db.display_url} reachable, schema {current} (current)")]
        if current is not None and (newer := newer_schema([current], script)) is not None:
            return [Check("database", False, f"{db.display_url} reachable, but {newer}")]
        return [Check("database", True, f"{db.display_url} reachable, schema {current or 'empty'}; newest is {head}",
                      "`bot migrate` upgrades it in place (`bot run` does too, at start)", warning=True)]
    except Exception as exc:
        return [Check("database", False, f"{db.display_url} unreachable: {type(exc).__name__}: {exc}",
                      "check DATABASE_URL, that the server runs, and the credentials in the URL")]
    finally:
        await db.close()


async def _deliveries(settings: Settings) -> list[Check]:
    """Answers given up (Slack refused them for good, or did not take them for DELIVERY_MAX_AGE_S)."""
    from datetime import UTC, datetime, timedelta

    from core.model import DeliveryStatus
    from core.store import Database
    from core.store.deliveries import DeliveryStore

    try:
        db = Database(settings.resolved_database_url)
    except Exception:
        return []  # the database check has said why
    try:
        store = DeliveryStore(db)
        lost = await store.count(DeliveryStatus.GIVEN_UP, since=datetime.now(UTC) - timedelta(days=7))
        waiting = await store.count(DeliveryStatus.PENDING)
    except Exception:
        return []  # unreachable (said above), or a schema from before deliveries: `bot run` upgrades it
    finally:
        await db.close()
    if lost:
        return [Check("deliveries", True, f"{lost} answer(s) in the last 7 days were never delivered "
                                          f"({waiting} still being retried)",
                      "look for \"given up\" in the log for Slack's reason (e.g. not_in_channel: invite the bot; "
                      "invalid_auth: fix SLACK_BOT_TOKEN; an outage: raise DELIVERY_MAX_AGE_S); their threads are "
                      "told once Slack takes posts again", warning=True)]
    return [Check("deliveries", True, f"no answer given up in the last 7 days ({waiting} being retried)")]


async def _keys(settings: Settings) -> list[Check]:
    """The keys load, every sealed value opens, and each is under the current key (else: rotate)."""
    from bot.channels import sealed_kinds
    from bot.keys import KEY_FILE, load_keyring
    from core.sealed_values import Unsettled, unsettled
    from core.store import Database

    try:
        if not settings.bot_secret_keys and not (settings.bot_home / KEY_FILE).exists():
            return [Check("encryption keys", True, "none yet: one is generated into BOT_HOME at the first start",
                          "in production set BOT_SECRET_KEYS (id:base64key) and keep a copy", warning=True)]
        keys = load_keyring(settings)
    except BotError as exc:
        return [Check("encryption keys", False, str(exc), "fix BOT_SECRET_KEYS or the key file's permissions")]
    db = Database(settings.resolved_database_url)
    count, found = 0, list[Unsettled]()  # as they stay if the database cannot be read
    try:
        count, found = await unsettled(sealed_kinds(db), keys)
    except Exception:
        pass  # the database check reports an unreachable database (or one `bot run` has not created yet)
    finally:
        await db.close()
    source = "BOT_SECRET_KEYS" if settings.bot_secret_keys else f"{settings.bot_home / KEY_FILE} (generated)"
    checks = []
    if broken := [u.problem for u in found if u.problem is not None]:
        checks.append(Check("encryption keys", False, "; ".join(broken),
                            "add the missing key to BOT_SECRET_KEYS (after the current one), then `bot credentials "
                            "rotate`; a value no key opens must be stored again (bot credentials set, reconnect, "
                            "or install the app into that workspace again)"))
    if old := [u for u in found if u.problem is None]:
        named = ", ".join(f"{u.label} (key {u.key_id!r})" if u.key_id != keys.current
                          else f"{u.label} (bound to its name only)" for u in old)
        checks.append(Check("sealed values", True, f"{len(old)} value(s) not under the current key {keys.current!r} "
                            f"(or not bound to their row): {named}",
                            f"run `bot credentials rotate` (it re-seals them under {keys.current!r}); only then "
                            "remove the old key(s) from BOT_SECRET_KEYS", warning=True))
    if not broken:
        warning = not settings.bot_secret_keys
        checks.insert(0, Check("encryption keys", True, f"current key {keys.current!r} from {source}; {count} sealed "
                               "value(s) open", "in production set BOT_SECRET_KEYS and keep a copy" if warning else "",
                               warning=warning))
    return checks


def _trust_boundary(settings: Settings) -> list[Check]:
    """The sandbox shell_run runs in, where http_request may connect, and who may approve commands."""
    from bot.home import sandbox_hidden
    from bot.sandbox import Bubblewrap, probe

    found = probe(settings.shell_sandbox, network=settings.shell_network, hide=sandbox_hidden(settings))
    checks = [Check("sandbox", True, found.summary, found.fix, warning=not isinstance(found.sandbox, Bubblewrap)),
              _egress(settings)]
    shared = any(settings.channels[p.name].enabled for p in installed_channels() if p.shared)
    if found.sandbox is not None and shared:  # shell_run is offered to people other than the operator
        checks += _approvers(settings)
    return checks


def _skills(settings: Settings) -> list[Check]:
    from bot.skills_command import doctor_checks

    return doctor_checks(settings)


def _egress(settings: Settings) -> Check:
    rule = "http_request refuses loopback, private and link-local addresses"
    if settings.http_allow_private:
        return Check("egress", True, f"HTTP_ALLOW_PRIVATE=true: the rule that {rule} is lifted (it can reach this "
                     "host, the local network and cloud metadata addresses)",
                     "unset HTTP_ALLOW_PRIVATE and list the few internal hosts it needs in HTTP_ALLOW_HOSTS",
                     warning=True)
    hosts = settings.allowed_http_hosts
    return Check("egress", True, f"{rule}" + (f", except {', '.join(hosts)} (HTTP_ALLOW_HOSTS)" if hosts else "")
                 + "; never this bot's own listener")


def _config_file(settings: Settings) -> list[Check]:
    """``bot.toml`` (agents, ``[slack]``): what `bot run` would refuse, said before it is run."""
    from bot.config.file import load_config
    from bot.policy_check import flag_warnings
    from bot.self_approval_check import self_approval_warnings, unsatisfiable_setup
    from core.passkeys import relying_party
    from core.policies import PolicyAction

    if not settings.bot_config.exists():
        return []
    try:
        toml = load_config(settings.bot_config)
        agents, sections = toml.agent_list(settings.bot_instructions), toml.sections()
        policies, connections = toml.policy_list(), toml.connection_specs(settings.bot_config)
    except BotError as exc:
        return [Check("bot.toml", False, str(exc),
                      f"correct {settings.bot_config} (docs/schedules-and-agents.md, docs/tools-and-approvals.md)")]
    checks = [Check("bot.toml", True, f"{len(agents)} agent(s), {len(policies)} approval rule(s)"
                                      + "".join(f", [{name}]" for name in sections))]
    # A rule that lets every call of a tool run unasked: a glob slip (``match`` forgotten) opens the host.
    wide = [p for p in policies if p.action is PolicyAction.ALLOW and p.match is None and p.tool != "time_now"]
    if wide:
        checks.append(Check("approval rules", False, "; ".join(f"{p.describe()} lets every call of {p.tool!r} run "
                                                               "without asking" for p in wide),
                            "give each allow rule a `match` (e.g. match = \"echo hello*\"), or remove it"))
    if stuck := unsatisfiable_setup(settings, policies, agents):  # `bot run` refuses to start with it
        checks.append(Check("self-approval", False, "; ".join(stuck),
                            "name approvers other than requester, set BOT_ADMINS, or allow self-approval "
                            "(docs/tools-and-approvals.md)"))
    if tight := self_approval_warnings(settings, policies):
        checks.append(Check("self-approval", True, "; ".join(tight),
                            "name more approvers than the quorum, or a user group", warning=True))
    if flagged := flag_warnings(policies):
        checks.append(Check("approval rules", True, "; ".join(flagged),
                            "docs/tools-and-approvals.md: Allow rules and files a command loads", warning=True))
    if connections:
        checks.append(_connections(settings, list(connections.values())))
    if (caps := _spending_caps(settings, toml)) is not None:
        checks.append(caps)
    if (stepping := [p for p in policies if p.step_up]) and isinstance(rp := relying_party(settings.bot_public_url),
                                                                         str):
        checks.append(Check("step-up", False, f"{stepping[0].describe()} has step_up = true, but {rp}",
                            "set BOT_PUBLIC_URL to the bot's https address (docs/security.md: Step-up)"))
    return checks


def _spending_caps(settings: Settings, toml: BotToml) -> Check | None:
    """A cost cap needs a price for every model the bot may call (`bot run` refuses it otherwise: core.spending)."""
    from core.spending import cost_cap_problem

    config = toml.caps_config()
    if not config.costs:
        return None
    models = [m for m in (settings.llm_model, settings.llm_fallback_model, *(t.model for t in toml.agents or []))
              if m]
    problem = cost_cap_problem(config, models)
    return Check("spending caps", problem is None, problem or f"every model has a price ({len(config.prices)})",
                 "add a [[prices]] table per model in bot.toml" if problem else "")


async def _event_sources(settings: Settings) -> list[Check]:
    """Each ``[[event_sources]]``: its secret is set (a GitHub secret long enough, a Standard Webhooks key that
    opens), its destination resolves, and the URL to give the sender."""
    from bot.config.file import load_config
    from bot.event_routes import secret_values
    from core.webhooks.signatures import secret_problem

    if not settings.bot_config.exists():
        return []
    try:
        sources = load_config(settings.bot_config).event_source_list()
    except BotError:
        return []  # the bot.toml check has said why
    base = (settings.bot_public_url or f"http://{settings.host}:{settings.port}").rstrip("/")
    plugin = next((p for p in installed_channels() if p.destinations), None)
    checks = []
    secrets = secret_values(sources)  # as `bot run` reads them: the environment, else .env
    for source in sources:
        name = f"event source {source.name}"
        url = f"{base}/events/{source.name}"
        secret = secrets.get(source.name)
        if not secret:
            checks.append(Check(name, False, f"{source.secret_env} is not set: every delivery is refused (401)",
                                f"set {source.secret_env} to the {source.kind} secret the sender signs with"))
            continue
        problem = secret_problem(source.kind, secret)
        if problem is not None:
            checks.append(Check(name, False, f"{source.secret_env}: {problem}",
                                f"set {source.secret_env} to a valid secret, and the same in the sender"))
            continue
        if plugin is None or not settings.channels[plugin.name].enabled or plugin.resolve_destination is None:
            checks.append(Check(name, False, f"destination {source.destination}: no channel here posts to it",
                                "configure Slack (SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET)"))
            continue
        try:
            where = await plugin.resolve_destination(settings.channels[plugin.name], source.destination)
        except Exception as exc:
            checks.append(Check(name, False, f"destination {source.destination}: {exc}",
                                "invite the bot to that channel, or correct `destination`"))
            continue
        checks.append(Check(name, True, f"{source.kind}, answers in {source.destination} ({where}) at trust "
                                        f"{source.trust}; configure the sender with POST {url}"))
    return checks


def _connections(settings: Settings, specs: list[Any]) -> Check:
    """Where consent comes back to, and which connections can never ask (no authorize_url)."""
    base = settings.bot_public_url or f"http://127.0.0.1:{settings.port}"
    names = ", ".join(f"{spec.name} ({spec.owner}; token to {', '.join(spec.hosts)})" for spec in specs)
    detail = f"{names}; register {base.rstrip('/')}/oauth/callback as the redirect URI with each provider"
    wide = [f"{spec.name} (*.{spec.hosts[0]})" for spec in specs if spec.hosts_defaulted and len(spec.hosts) > 1]
    if wide:
        detail += (f"; hosts not set, so tokens may go to every name below the token server's domain: "
                   f"{', '.join(wide)}")
    silent = [spec.name for spec in specs if spec.authorize_url is None]
    if silent:
        return Check("connections", True, f"{detail}; no authorize_url: {', '.join(silent)} (calls fail, never ask)",
                     "add authorize_url to those entries to let people connect from the conversation", warning=True)
    if wide:
        return Check("connections", True, detail, "set `hosts` to the API hosts (e.g. hosts = [\"api.github.com\"]) "
                     "where that domain also serves others (acme.okta.com: every *.okta.com)", warning=True)
    if settings.bot_public_url is None:
        return Check("connections", True, detail, "set BOT_PUBLIC_URL (the address people's browsers reach the bot "
                     "at): without it only a browser on this machine can finish connecting", warning=True)
    return Check("connections", True, detail)


async def _oncall(settings: Settings) -> list[Check]:
    """``oncall:`` approvers: PagerDuty takes PAGERDUTY_TOKEN (bot.oncall)."""
    from bot.config.file import load_config
    from bot.oncall import oncall_check

    try:
        toml = load_config(settings.bot_config) if settings.bot_config.exists() else None
        agents = toml.agent_list(settings.bot_instructions) if toml is not None else []
        policies = toml.policy_list() if toml is not None else []
    except BotError:
        return []  # said by the bot.toml check
    check = await oncall_check(settings, agents, policies)
    return [check] if check is not None else []


def _approvers(settings: Settings) -> list[Check]:
    """Approvers that are only the requester let anyone in a channel approve their own shell commands."""
    from fnmatch import fnmatchcase

    from bot.config.file import load_agents
    from bot.people import people
    from core.oncall import is_oncall
    from core.people import REQUESTER

    try:
        agents = load_agents(settings.bot_config, default_instructions=settings.bot_instructions)
    except BotError:
        return []  # `bot run` names the problem in bot.toml
    named, shared = people(), {plugin.name for plugin in installed_channels() if plugin.shared}

    def stops_others(entry: str) -> bool:
        """Someone of a shared channel (``web`` and ``web:web`` are the operator, however written), or whoever is
        on call (``oncall:<schedule>``: Slack's people)."""
        return entry != REQUESTER and (named.owner(entry)[0] in shared or is_oncall(entry))

    if not settings.bot_self_approval:  # nobody approves their own call (core.self_approval)
        return []
    open_to = [a.name for a in agents
               if any(fnmatchcase("shell_run", pattern) for pattern in a.tools)
               and REQUESTER in (a.approvers or settings.approvers)
               and not any(stops_others(entry) for entry in a.approvers or settings.approvers)]
    if not open_to:
        return []
    by_agent = [a.name for a in agents if a.name in open_to and a.approvers]
    who = f"the approvers of agent {', '.join(by_agent)} are" if by_agent else "BOT_APPROVERS is"
    return [Check("approvers", True, f"{who} only `requester` while shell_run is on: in Slack anyone in a "
                  "channel can ask for a command and approve their own shell commands",
                  "set BOT_APPROVERS (or `approvers` in bot.toml) to the Slack user or user group ids who may "
                  "approve, e.g. BOT_APPROVERS=U0123ABCD,S0456EFGH; or set BOT_SELF_APPROVAL=false", warning=True)]


def _models(settings: Settings) -> list[tuple[str, ModelEndpoint]]:
    """The models `bot doctor` asks: the primary ("model"), and the fallback ("fallback model") when set."""
    from bot.model_endpoints import fallback_endpoint, primary_endpoint

    fallback = fallback_endpoint(settings)
    return [("model", primary_endpoint(settings)), *([("fallback model", fallback)] if fallback is not None else [])]


async def openai_model_check(base_url: str | None, api_key: str | None, model: str, *, timeout_s: float,
                             name: str = "model", where: str = "LLM_BASE_URL, LLM_API_KEY and LLM_MODEL") -> Check:
    """An OpenAI-compatible endpoint: its ``GET /models`` over the provider's own client (proxy, timeouts), so
    the key is tried and ``model`` looked for. Only the endpoint's settings go in, so a primary model and a
    fallback one are checked alike."""
    from bot.providers.openai_compat import OpenAICompatibleProvider
    from core.errors import ProviderError

    provider = OpenAICompatibleProvider(base_url=base_url, api_key=api_key, model=model, timeout_s=timeout_s)
    base = provider.base_url
    try:
        names = await provider.model_names()
    except ProviderError as exc:
        return Check(name, False, exc.user_message, f"check {where}")
    finally:
        await provider.aclose()
    if names is None:
        return Check(name, True, f"{base} answers (it lists no models)", warning=True)
    if names and model not in names:
        # The ids are the endpoint's words, printed to a terminal: no control characters, none very long.
        shown = ["".join(c for c in n if c.isprintable())[:80] for n in names[:5]]
        return Check(name, False, f"{base} has no model {model!r} "
                     f"(it has {', '.join(shown)}{'…' if len(names) > 5 else ''})",
                     f"set {where.rsplit(' and ', 1)[-1]} to one of those")
    return Check(name, True, f"{base} reachable, model {model!r}")


async def _anthropic_model(settings: Settings, endpoint: ModelEndpoint | None = None, name: str = "model") -> Check:
    """The key and the model, asked of the Messages API's host: the model's entry, or (a proxy without
    /v1/models) a one-token message."""
    import anthropic

    from bot.model_endpoints import primary_endpoint
    from bot.providers.anthropic import api_base, classify
    from bot.providers.anthropic import client as anthropic_client

    endpoint = endpoint or primary_endpoint(settings)
    model, model_setting = endpoint.model, endpoint.names.rsplit(" and ", 1)[-1]
    base = api_base(endpoint.base_url)
    fix = f"check {endpoint.names}"
    client = anthropic_client(endpoint.api_key, base, 10)
    try:
        try:
            info = await client.models.retrieve(model or "")
            detail = f"{base} reachable, key accepted, model {model!r} ({info.display_name})"
            if getattr(info, "lifecycle", None) == "deprecated":
                return Check(name, True, f"{detail} is deprecated", f"choose a current model for {model_setting}",
                             warning=True)
        except anthropic.NotFoundError:  # no such model, or a proxy without the models endpoint
            await client.messages.create(model=model or "", max_tokens=1,
                                         messages=[{"role": "user", "content": "ping"}])
            detail = f"{base} reachable, key accepted, model {model!r} answers"
    except anthropic.NotFoundError:
        return Check(name, False, f"{base} has no model {model!r}",
                     f"set {model_setting} to a model id your Anthropic account has (e.g. claude-sonnet-4-5)")
    except anthropic.APIError as exc:
        return Check(name, False, classify(exc).user_message, fix)
    finally:
        await client.close()
    return Check(name, True, detail)


_MCP_FIX = {
    "oauth": "add a [[connections]] entry for its authorization server and connection = \"<name>\" in its entry",
    "invalid_token": "store a valid token (bot credentials set NAME) or reconnect its connection",
    "basic": "store the whole header as its credential (e.g. \"Authorization: Basic …\")",
    "sandbox": "install bubblewrap, or set sandbox = false in its entry (then it runs unsandboxed)",
}


async def _mcp_servers(settings: Settings) -> list[Check]:
    """Start each [[mcp_servers]] entry once, list its tools, stop it: what `bot run` would get."""
    from bot.config.file import load_mcp_servers
    from bot.home import sandbox_hidden
    from bot.mcp.manager import McpServers
    from bot.sandbox import probe
    from core.tools import ToolRegistry

    try:
        specs = load_mcp_servers(settings.bot_config)
    except BotError:
        return []  # said by the bot.toml check
    if not specs:
        return []

    async def nothing(*_args: Any) -> None:
        return None

    from bot.operator import _core

    try:
        async with _core() as core:
            found = probe(settings.shell_sandbox, network=settings.shell_network, hide=sandbox_hidden(settings))
            servers = McpServers(specs, home=settings.bot_home.resolve(), sandbox=found.sandbox,
                                 audit=nothing, env_for=core.credentials.env_for,
                                 credential_headers=core.credentials.headers_for)
            try:
                await servers.start(ToolRegistry(), timeout_s=20)
            finally:
                await servers.stop()
    except BotError as exc:
        return [Check("mcp servers", False, str(exc), "fix the database or keys first (see above)")]
    checks = []
    for name, ok, text in servers.report():
        problem = servers.servers[name].problem
        fix = "" if ok else _MCP_FIX.get(problem.kind if problem else "", "check its command or url, and its log "
                                         f"({settings.bot_home}/mcp/{name}.stderr.log for a stdio server)")
        if ok and name in servers.unsandboxed:
            checks.append(Check(f"mcp {name}", ok, text, "install bubblewrap (SHELL_SANDBOX=bwrap), or set sandbox "
                                "= false in its entry to accept that it runs on the host", warning=True))
            continue
        checks.append(Check(f"mcp {name}", ok, text, fix))
    return checks
