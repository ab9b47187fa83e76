"""``[[mcp_servers]]`` (SPEC §16): MCP tool servers, each a stdio program or a streamable HTTP endpoint."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator
from yarl import URL

from bot.config.table import Problem, Says, Table, Text, loopback
from bot.mcp.spec import SEPARATOR, McpServerSpec
from core.stored_secrets import NAME, env_name

SERVER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")  # the tools' prefix: <server>__<tool>
# What a stdio server's environment holds before its credentials: a credential may not replace it.
_RESERVED_ENV = {"PATH", "HOME", "LANG", "BOT_SHELL_RUN"}


def _url(value: str) -> str:
    try:
        parsed = URL(value)
    except ValueError:
        raise Problem("is not a valid URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise Problem()
    return value


def _handed(name: str) -> str:
    """One of ``env``: a credential name, handed to the server as its upper-cased variable."""
    if not NAME.match(name):
        raise Problem(f"{name!r} is not a credential name")
    variable = env_name(name)
    if variable in _RESERVED_ENV or variable.startswith("LD_"):
        raise Problem(f"{name!r} would become {variable}, which the bot sets itself (the server's PATH, HOME, "
                      "LANG, the loader's LD_* or the process marker): store the credential under another name")
    return name


CredentialName = Annotated[str, Says("must be a name")]


class McpServerTable(Table):
    """An MCP server; its tools reach the model as <name>__<tool>. Give `command` or `url`, not both."""

    name: Annotated[str, Says("must be lower-case letters, digits, - or _ (no '__'), e.g. 'github'")] = Field(
        pattern=SERVER_NAME.pattern, description="the server's name, the prefix of its tools' names")
    command: list[Text] | None = Field(None, min_length=1, description="a program and its arguments, e.g. "
                                       "[\"npx\", \"-y\", \"@scope/server\"] (a stdio server)")
    url: Annotated[str, AfterValidator(_url)] | None = Field(None, description="an http:// or https:// URL "
                                                                               "(a streamable HTTP server)")
    env: list[Annotated[str, AfterValidator(_handed)]] = Field(
        [], description="a list of credential names handed to a stdio server (github.token as GITHUB_TOKEN)")
    credential: CredentialName | None = Field(None, pattern=NAME.pattern,
                                              description="a stored credential: an HTTP server's bearer token")
    connection: CredentialName | None = Field(None, pattern=NAME.pattern,
                                              description="an OAuth connection whose token is the HTTP server's "
                                                          "bearer token")
    risk: Literal["gated", "safe"] = Field("gated", description="'gated' (a person approves each call) or 'safe'")
    tools: list[Text] = Field(["*"], description="a list of globs over its tools' names (default all)")
    timeout_s: float = Field(60, gt=0, le=3600, description="a number of seconds between 0 and 3600 (default 60)")
    sandbox: bool = Field(True, description="true or false: a stdio server runs in the shell_run sandbox unless "
                                            "false")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if SEPARATOR in name:
            raise Problem()
        if name.endswith(("_", "-")):  # gh_'s tool x would be gh___x, like gh's tool _x; and gh__* would match it
            raise Problem(f"{name!r} must not end with '_' or '-' (its tools are named <name>{SEPARATOR}<tool>, "
                          "and another server's names could then pass for its own)")
        return name

    @model_validator(mode="after")
    def _one_kind(self) -> McpServerTable:
        if (self.command is None) == (self.url is None):
            raise Problem(": give either command (a stdio server) or url (streamable HTTP), not both")
        if self.env and self.url is not None:
            raise Problem("hands credentials to a stdio server; an HTTP server takes credential", at=("env",))
        for key, value in (("credential", self.credential), ("connection", self.connection)):
            if value is not None and self.url is None:
                raise Problem("is an HTTP server's bearer token; a stdio server takes env", at=(key,))
        if self.credential is not None and self.connection is not None:
            raise Problem(": give credential or connection, not both")
        token = self.credential is not None or self.connection is not None
        if self.url is not None and token and URL(self.url).scheme == "http" \
                and not loopback(URL(self.url).raw_host or ""):
            raise Problem("is http://: its bearer token would cross the network in clear text; use https:// "
                          "(plain http is accepted for localhost / 127.0.0.1 / ::1 only)", at=("url",))
        return self

    def spec(self) -> McpServerSpec:
        return McpServerSpec(name=self.name, command=tuple(self.command or ()), url=self.url, env=tuple(self.env),
                             credential=self.credential, connection=self.connection, risk=self.risk,
                             tools=tuple(self.tools), timeout_s=float(self.timeout_s), sandbox=self.sandbox)
