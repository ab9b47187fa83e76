"""Every setting, from the environment and ``.env``, validated once at start (SPEC §2)."""

from __future__ import annotations

import importlib
import ipaddress
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from bot.channels import installed_channels
from bot.errors import SettingsError
from core.plugins import ChannelSettings

QueueMode = Literal["steer", "collect", "followup"]
ProviderName = Literal["openai", "anthropic", "demo"]


class Settings(BaseSettings):
    """The server's own settings; each channel's (``SLACK_*``…) are its own model, in ``channels``."""

    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore")
    # Values masked in every log line and reply, and never echoed in a settings error.
    SECRETS: ClassVar[tuple[str, ...]] = ("llm_api_key", "llm_fallback_api_key", "bot_web_token", "bot_secret_keys",
                                          "database_url", "pagerduty_token")
    _channels: dict[str, ChannelSettings] = PrivateAttr(default_factory=dict)

    # Server
    host: str = "127.0.0.1"
    port: int = Field(default=3000, ge=0, le=65535)

    # Web chat (SPEC §12)
    bot_web_chat: bool = True
    bot_web_token: str | None = None

    # Storage
    bot_home: Path = Path("./.bot")
    database_url: str | None = None
    # SQLite only. NORMAL: a commit survives the process being killed, not a power cut or OS crash (the
    # last commits may roll back, the file stays sound). FULL: it survives those too, at one fsync per
    # commit (a group of messages shares one).
    sqlite_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    # PostgreSQL: connections `bot run` keeps open (up to twice as many while busy)
    database_pool_size: int = Field(default=10, ge=1, le=100)
    bot_secret_keys: str | None = None
    # Skills (SPEC §17): <name>/SKILL.md folders; default $BOT_HOME/skills. Mounted read-only at /skills for shell_run.
    skills_dir: Path | None = None

    # Model
    llm_provider: ProviderName | None = None
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    llm_model: str | None = None
    llm_timeout_s: float = Field(default=120.0, gt=0)
    llm_stream: bool = True  # ask the model to stream (answers show while written); off for endpoints that cannot
    llm_max_attempts: int = Field(default=4, ge=1, le=10)
    llm_retry_base_s: float = Field(default=0.5, ge=0)
    # What one model request may hold: the replayed thread is fitted into it (shortened, summarised).
    llm_context_tokens: int = Field(default=32_000, ge=4_000, le=10_000_000)
    # Tokens a thread's model calls may use before its turn waits for Continue (unset: no budget).
    thread_token_budget: int | None = Field(default=None, ge=1_000, le=1_000_000_000)
    # A streamed answer silent this long has failed (not retried: the fallback answers, else the turn fails).
    llm_idle_timeout_s: float = Field(default=120.0, gt=0)
    # The fallback model (SPEC §17): configured when LLM_FALLBACK_MODEL is set. A session whose primary fails for good
    # goes on with it, and stays on it. Provider default LLM_PROVIDER; base URL default LLM_BASE_URL (same provider)
    # or the provider's own; key default LLM_API_KEY only where it would go to the primary's own endpoint.
    llm_fallback_provider: ProviderName | None = None
    llm_fallback_base_url: str | None = None
    llm_fallback_api_key: str | None = None
    llm_fallback_model: str | None = None

    # Agent
    bot_instructions: str | None = None
    max_steps: int = Field(default=25, ge=1, le=200)
    # Sub-agents (delegate): how many run at once per parent turn (more wait for a slot), and each one's steps.
    max_subagents_per_turn: int = Field(default=4, ge=1, le=64)
    subagent_max_steps: int = Field(default=10, ge=1, le=200)
    tool_result_max_chars: int = Field(default=16_000, ge=200)
    bot_record_thread_context: bool = True

    # Memory (SPEC §17): pinned memories' share of every system prompt (characters, frame included), memories one
    # agent keeps (the oldest unpinned go first), and the optional memory pass after each member's turn.
    memory_pinned_max_chars: int = Field(default=4_000, ge=0, le=100_000)
    memory_max_items: int = Field(default=1_000, ge=1, le=100_000)
    memory_pass: bool = False

    # People and policy
    bot_approvers: str = "requester"
    bot_admins: str | None = None
    # Separation of duties (SPEC §17): false: nobody whose words a turn took may approve what it asks for (the
    # default of every [[policies]] rule, and what covers calls no rule decides).
    bot_self_approval: bool = True
    approval_timeout_s: float = Field(default=900, gt=0)
    approval_poll_s: float = Field(default=2.0, gt=0)
    bot_config: Path = Path("bot.toml")
    credential_timeout_s: float = Field(default=1800, gt=0)
    credential_max_bytes: int = Field(default=16_384, ge=64, le=1_000_000)
    connection_timeout_s: float = Field(default=1800, gt=0)  # a call parked for consent waits this long
    image_max_bytes: int = Field(default=5_000_000, ge=1_000, le=20_000_000)  # a shared image the model is given
    bot_public_url: str | None = None
    # Events in (SPEC §17): a delivery's body is read up to this size (larger: 413); events are kept this long.
    event_max_body_bytes: int = Field(default=1_048_576, ge=1_024, le=64 * 1_048_576)
    event_retention_days: int = Field(default=30, ge=1, le=3650)
    schedule_min_interval_s: int = Field(default=60, ge=1)
    schedule_misfire_grace_min: float = Field(default=5, gt=0)
    lease_ttl_s: float = Field(default=30, ge=1)
    queue_mode: QueueMode = "steer"
    queue_debounce_ms: int = Field(default=500, ge=0, le=60_000)
    queue_max_waiting: int = Field(default=20, ge=1, le=1000)
    max_concurrent_turns: int = Field(default=8, ge=1, le=1000)

    # Trust boundary (SPEC §16): where shell_run runs and where http_request may connect
    shell_sandbox: Literal["bwrap", "none"] = "bwrap"
    shell_network: bool = True
    http_allow_private: bool = False
    http_allow_hosts: str | None = None
    # Reverse proxies (IP addresses) whose X-Forwarded-Proto / X-Forwarded-Host are believed.
    bot_trusted_proxies: str | None = None

    # On-call approvers (SPEC §17): `oncall:<schedule id>` entries are read from PagerDuty's REST API.
    pagerduty_token: str | None = None
    pagerduty_api_url: str = "https://api.pagerduty.com"

    # Operations
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    shutdown_drain_s: float = Field(default=20.0, ge=0)
    # An answer Slack did not take (an outage) is retried with backoff from DELIVERY_RETRY_BASE_S, up to
    # this long after it was written; then it is given up (counted in /metrics and `bot doctor`).
    delivery_max_age_s: float = Field(default=3600, gt=0)
    delivery_retry_base_s: float = Field(default=1.0, gt=0)

    @field_validator(
        "database_url", "bot_secret_keys",
        "llm_base_url", "llm_api_key", "llm_model", "bot_admins", "bot_instructions", "llm_provider",
        "llm_fallback_provider", "llm_fallback_base_url", "llm_fallback_api_key", "llm_fallback_model",
        "bot_web_token", "bot_public_url", "http_allow_hosts", "bot_trusted_proxies", "skills_dir",
        "pagerduty_token", mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("bot_secret_keys")
    @classmethod
    def _keys(cls, value: str | None) -> str | None:
        if value is not None:
            from core.errors import VaultError
            from core.vault import KeyRing

            try:
                KeyRing.parse(value)
            except VaultError as exc:
                raise ValueError(f"{exc} (generate a key with: python -c \"import base64,os; "
                                 "print('k1:' + base64.b64encode(os.urandom(32)).decode())\")") from None
        return value

    @field_validator("llm_base_url", "llm_fallback_base_url", "bot_public_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("pagerduty_api_url")
    @classmethod
    def _pagerduty_url(cls, value: str) -> str:
        """The token goes there: https, or plain http to this machine only (a fake server in tests)."""
        from yarl import URL

        from bot.config.table import loopback

        try:
            url = URL(value.strip())
        except ValueError:
            raise ValueError("is not a URL") from None
        if url.scheme not in ("https", "http") or not url.host or url.user or url.password or url.query_string \
                or url.fragment:
            raise ValueError("must be an https:// URL with no user, query or fragment (e.g. https://api.pagerduty.com)")
        if url.scheme == "http" and not loopback(url.host):
            raise ValueError("must be https:// (plain http only to localhost or 127.0.0.1): PAGERDUTY_TOKEN is sent "
                             "there")
        return str(url).rstrip("/")

    @field_validator("sqlite_synchronous", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError("is not a valid SQLAlchemy URL (e.g. sqlite:///path/bot.db, "
                             "postgresql://user:pass@host/db)") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"must be sqlite or postgresql, not {url.get_backend_name()!r}")
        # The tail of a password holding an unescaped "@" would be shown (and used) as the host name, or, with a "/"
        # after it, as the host and the database's name.
        if "@" in (url.host or "") or (url.get_backend_name() == "postgresql" and "@" in (url.database or "")):
            raise ValueError("has an '@' in its user name or password: write it as %40")
        # SQLite would parse a URI filename itself (another file, or its own locking turned off by
        # nolock=1): the run lock and BOT_HOME's file modes need the plain path SQLite opens.
        if url.get_backend_name() == "sqlite" and ("uri" in url.query or
                                                   (url.database or "").lower().startswith("file:")):
            raise ValueError("SQLite URI filenames (file:..., ?uri=true) are not supported: give the file's "
                             "path, e.g. sqlite:////srv/bot/bot.db (absolute) or sqlite:///bot.db (relative)")
        if url.get_backend_name() == "postgresql":
            missing_extra("postgres", "asyncpg", "psycopg")
        return value

    @field_validator("llm_provider", "llm_fallback_provider")
    @classmethod
    def _provider_installed(cls, value: str | None) -> str | None:
        if value == "anthropic":
            missing_extra("anthropic", "anthropic")
        return value

    @field_validator("http_allow_hosts")
    @classmethod
    def _host_names(cls, value: str | None) -> str | None:
        for item in _split(value or ""):
            if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\]", item):
                raise ValueError(f"{item!r} is not a host name or address (comma-separated, no scheme or port)")
        return value

    @field_validator("bot_trusted_proxies")
    @classmethod
    def _proxy_addresses(cls, value: str | None) -> str | None:
        for item in _split(value or ""):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network") from None
        return value

    @field_validator("bot_approvers", "bot_admins")
    @classmethod
    def _people(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        from bot.people import is_approver, is_person

        approvers = info.field_name == "bot_approvers"  # an admin is a person, never a rota
        for item in _split(value):
            if not (is_approver(item) if approvers else is_person(item)):
                rota = ", oncall:<PagerDuty schedule id> (e.g. oncall:P1AB2CD)" if approvers else ""
                raise ValueError(f"{item!r} is not a Slack user id (U…/W…), user-group id (S…), "
                                 f"'requester', 'web' (whoever uses the web chat){rota} or <channel>:<id>")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.bot_web_chat and not self.is_local_bind and not self.bot_web_token:
            raise ValueError(
                f"HOST={self.host} makes the web chat reachable from other machines, so it needs a login: "
                "set BOT_WEB_TOKEN to a long random string (e.g. `openssl rand -hex 32`), keep HOST=127.0.0.1, "
                "or turn the web chat off with BOT_WEB_CHAT=false"
            )
        if self.bot_web_token is not None and len(self.bot_web_token) < 16:
            raise ValueError("BOT_WEB_TOKEN must be at least 16 characters")
        if self.provider == "openai" and not self.llm_model:
            raise ValueError("LLM_MODEL is required for an OpenAI-compatible endpoint (e.g. gpt-4o-mini)")
        if self.provider == "anthropic":
            if not self.llm_model:
                raise ValueError("LLM_MODEL is required for LLM_PROVIDER=anthropic (e.g. claude-sonnet-4-5)")
            if not self.llm_api_key and not self.llm_base_url:
                raise ValueError("LLM_API_KEY is required for LLM_PROVIDER=anthropic (an Anthropic API key, "
                                 "sk-ant-…)")
        from bot.model_endpoints import fallback_problem

        if (problem := fallback_problem(self)) is not None:
            raise ValueError(problem)
        return self

    # -- derived --------------------------------------------------------------------------------

    @property
    def provider(self) -> ProviderName:
        if self.llm_provider is not None:
            return self.llm_provider
        return "openai" if (self.llm_base_url or self.llm_model) else "demo"

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.bot_home / 'bot.db').resolve()}"

    @property
    def resolved_skills_dir(self) -> Path:
        """SKILLS_DIR, or ``$BOT_HOME/skills``, as an absolute path."""
        return (self.skills_dir or self.bot_home / "skills").absolute()

    @property
    def approvers(self) -> tuple[str, ...]:
        return tuple(_split(self.bot_approvers))

    @property
    def admins(self) -> tuple[str, ...]:
        return tuple(_split(self.bot_admins or ""))

    @property
    def allowed_http_hosts(self) -> tuple[str, ...]:
        """HTTP_ALLOW_HOSTS, lower-cased: hosts http_request may reach even on private addresses."""
        return tuple(h.lower().strip("[]") for h in _split(self.http_allow_hosts or ""))

    @property
    def trusted_proxies(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(p, strict=False) for p in _split(self.bot_trusted_proxies or ""))

    @property
    def is_local_bind(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def channels(self) -> dict[str, ChannelSettings]:
        """Each installed channel's own settings, by channel name."""
        return dict(self._channels)

    def named_secrets(self) -> list[tuple[str, str]]:
        """Every secret setting's value with what to call it where it is masked: the variable's name, or
        "setting" for a part of one (a key of BOT_SECRET_KEYS, DATABASE_URL's password). The one list the log
        filter, the redactor and settings errors read."""
        named: dict[str, str | None] = {"LLM_API_KEY": self.llm_api_key,
                                        "LLM_FALLBACK_API_KEY": self.llm_fallback_api_key,
                                        "BOT_WEB_TOKEN": self.bot_web_token, "PAGERDUTY_TOKEN": self.pagerduty_token}
        for channel in self._channels.values():
            named |= channel.secrets()
        pairs = [(name, value) for name, value in named.items() if value and len(value) >= 4]
        parts: list[str | None] = []
        if self.bot_secret_keys:
            parts.extend(part.split(":", 1)[-1] for part in _split(self.bot_secret_keys))
        if self.database_url:
            password = make_url(self.database_url).password
            parts.append(str(password) if password else None)
        known = {value for _name, value in pairs}
        return pairs + [("setting", v) for v in dict.fromkeys(parts) if v and len(v) >= 4 and v not in known]

    def secret_values(self) -> list[str]:
        """Values that must never reach a log line."""
        return [value for _name, value in self.named_secrets()]


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def missing_extra(extra: str, *modules: str) -> None:
    """Raise ValueError naming what to install when a setting needs an optional dependency that is absent
    (one line for the operator, never a traceback from deep inside a driver)."""
    absent = [m for m in modules if not _importable(m)]
    if absent:
        raise ValueError(f"needs {', '.join(absent)}, which {'is' if len(absent) == 1 else 'are'} not installed: "
                         f"pip install 'chatops-gateway[{extra}]'")


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def load_settings(env_file: str | Path | None = ".env", **overrides: object) -> Settings:
    """Read and validate the server's settings and every installed channel's; raise SettingsError with one line
    per bad variable. An override ``slack_bot_token`` goes to the channel whose prefix is ``SLACK_``."""
    lines: list[str] = []
    channels: dict[str, ChannelSettings] = {}
    for plugin in installed_channels():
        prefix = str(plugin.settings.model_config.get("env_prefix", "")).lower()
        own = {key[len(prefix):]: value for key, value in overrides.items() if prefix and key.startswith(prefix)}
        try:
            channels[plugin.name] = _read(plugin.settings, env_file, own)
        except ValidationError as exc:
            lines += _lines(exc, prefix.upper(), _secret_names(plugin.settings, prefix.upper()))
    try:
        settings = _read(Settings, env_file, overrides)
    except ValidationError as exc:
        lines += _lines(exc, "", _secret_names(Settings, ""))
        settings = None
    if settings is None or lines:
        raise SettingsError("invalid settings:\n  " + "\n  ".join(lines))
    settings._channels = channels
    return settings


def secret_names() -> list[str]:
    """The variables of every secret setting: the server's and each installed channel's."""
    names = _secret_names(Settings, "")
    for plugin in installed_channels():
        names |= _secret_names(plugin.settings, str(plugin.settings.model_config.get("env_prefix", "")).upper())
    return sorted(names)


def _read(model: type[Any], env_file: str | Path | None, values: dict[str, object]) -> Any:
    factory: Any = model  # pydantic-settings' init keywords are not visible to mypy
    return factory(_env_file=env_file, **values)


def _secret_names(model: type[Any], prefix: str) -> set[str]:
    return {prefix + name.upper() for name in model.SECRETS}


def _lines(exc: ValidationError, prefix: str, secret: set[str]) -> list[str]:
    lines = []
    for err in exc.errors():
        field = "_".join(str(p) for p in err["loc"]).upper()
        name = prefix + field if field else "settings"
        shown = err.get("input")
        value = "" if name in secret or isinstance(shown, dict) else f" (got {shown!r})"
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{name}{value}: {message}" if name != "settings" else message)
    return lines
