"""``[[mcp_servers]]`` in ``bot.toml``: checked strictly at start."""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from yarl import URL

from bot.config_file import read_config, strings
from bot.errors import SettingsError
from core.stored_secrets import NAME, env_name

_KEYS = {"name", "command", "url", "env", "credential", "connection", "risk", "tools", "timeout_s", "sandbox"}
SERVER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")  # the tools' prefix: <server>__<tool>
SEPARATOR = "__"
# What a stdio server's environment holds before its credentials: a credential may not replace it.
_RESERVED_ENV = {"PATH", "HOME", "LANG", "BOT_SHELL_RUN"}


@dataclass(frozen=True)
class McpServerSpec:
    name: str
    command: tuple[str, ...] = ()  # a stdio server
    url: str | None = None  # a streamable HTTP server
    env: tuple[str, ...] = ()  # credential names handed to a stdio server (as NAME upper-cased)
    credential: str | None = None  # an HTTP server's bearer token: a stored credential…
    connection: str | None = None  # …or an OAuth connection's token
    risk: Literal["gated", "safe"] = "gated"
    tools: tuple[str, ...] = ("*",)
    timeout_s: float = 60.0
    sandbox: bool = True

    @property
    def kind(self) -> str:
        return "stdio" if self.command else "http"


def load_mcp_servers(path: Path) -> list[McpServerSpec]:
    data = read_config(path)
    if "mcp_servers" not in data:
        return []
    entries = data["mcp_servers"]
    if not isinstance(entries, list):
        raise SettingsError(f"{path}: [[mcp_servers]] must be an array of tables")
    specs = [_server(f"{path}: mcp_servers[{i}]", entry) for i, entry in enumerate(entries)]
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SettingsError(f"{path}: two [[mcp_servers]] share the name {twice[0]!r}")
    return specs


def _server(where: str, entry: Any) -> McpServerSpec:
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a table")
    unknown = set(entry) - _KEYS
    if unknown:
        raise SettingsError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not SERVER_NAME.match(name) or SEPARATOR in name:
        raise SettingsError(f"{where}.name must be lower-case letters, digits, - or _ (no '__'), e.g. 'github'")
    if name.endswith(("_", "-")):  # gh_'s tool x would be gh___x, like gh's tool _x; and gh__* would match it
        raise SettingsError(f"{where}.name {name!r} must not end with '_' or '-' (its tools are named "
                            f"<name>{SEPARATOR}<tool>, and another server's names could then pass for its own)")
    where = f"{where} ({name})"
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise SettingsError(f"{where}: give either command (a stdio server) or url (streamable HTTP), not both")
    argv = tuple(strings(where, "command", command)) if command is not None else ()
    if command is not None and not argv:
        raise SettingsError(f"{where}.command must name a program, e.g. [\"npx\", \"-y\", \"@scope/server\"]")
    if url is not None:
        if not isinstance(url, str):
            raise SettingsError(f"{where}.url must be an http(s) URL")
        try:
            parsed = URL(url)
        except ValueError:
            raise SettingsError(f"{where}.url is not a valid URL") from None
        if parsed.scheme not in ("http", "https") or not parsed.raw_host:
            raise SettingsError(f"{where}.url must be an http:// or https:// URL")
    env = tuple(strings(where, "env", entry.get("env", [])))
    for handed in env:
        if not NAME.match(handed):
            raise SettingsError(f"{where}.env: {handed!r} is not a credential name")
        variable = env_name(handed)
        if variable in _RESERVED_ENV or variable.startswith("LD_"):
            raise SettingsError(f"{where}.env: {handed!r} would become {variable}, which the bot sets itself "
                                "(the server's PATH, HOME, LANG, the loader's LD_* or the process marker): "
                                "store the credential under another name")
    if env and url is not None:
        raise SettingsError(f"{where}.env hands credentials to a stdio server; an HTTP server takes credential")
    credential, connection = entry.get("credential"), entry.get("connection")
    for key, value in (("credential", credential), ("connection", connection)):
        if value is not None and (not isinstance(value, str) or not NAME.match(value)):
            raise SettingsError(f"{where}.{key} must be a name")
        if value is not None and url is None:
            raise SettingsError(f"{where}.{key} is an HTTP server's bearer token; a stdio server takes env")
    if credential is not None and connection is not None:
        raise SettingsError(f"{where}: give credential or connection, not both")
    if url is not None and (credential is not None or connection is not None) and URL(url).scheme == "http" \
            and not _loopback(URL(url).raw_host or ""):
        raise SettingsError(f"{where}.url is http://: its bearer token would cross the network in clear text; "
                            "use https:// (plain http is accepted for localhost / 127.0.0.1 / ::1 only)")
    risk = entry.get("risk", "gated")
    if risk not in ("gated", "safe"):
        raise SettingsError(f"{where}.risk must be 'gated' (a person approves each call) or 'safe'")
    tools = tuple(strings(where, "tools", entry.get("tools", ["*"])))
    timeout = entry.get("timeout_s", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) \
            or not 0 < timeout <= 3600:
        raise SettingsError(f"{where}.timeout_s must be a number of seconds between 0 and 3600")
    sandbox = entry.get("sandbox", True)
    if not isinstance(sandbox, bool):
        raise SettingsError(f"{where}.sandbox must be true or false")
    return McpServerSpec(name=name, command=argv, url=url, env=env, credential=credential, connection=connection,
                         risk=risk, tools=tools, timeout_s=float(timeout), sandbox=sandbox)


def _loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
