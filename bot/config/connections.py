"""``[[connections]]`` (SPEC §16): OAuth providers a person connects an account of.

The client secret is never in the file: ``client_secret_env`` names the environment variable (or a line of
``.env``) that holds it. Endpoints must be https (plain http only to this machine, for a local provider).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator
from yarl import URL

from bot.config.table import Problem, Says, Table, Text, loopback
from core.connections.spec import ConnectionSpec
from core.hosts import default_hosts, parse_hosts
from core.stored_secrets import NAME

_HTTPS = "must be an https:// URL (it carries the client secret and tokens)"


def _endpoint(value: str) -> str:
    try:
        url = URL(value)
    except ValueError:
        raise Problem("is not a valid URL") from None
    if url.scheme == "https" and url.raw_host:
        return value
    if url.scheme == "http" and url.raw_host and loopback(url.raw_host):
        return value  # a provider on this machine (development, tests)
    raise Problem(_HTTPS)


def _variable(value: str) -> str:
    if not value.isidentifier():
        raise Problem()
    return value


def _scope(value: str) -> str:
    if " " in value:
        raise Problem("holds a space: give each scope as its own string")
    return value


Endpoint = Annotated[str, Says(_HTTPS), AfterValidator(_endpoint)]


class ConnectionTable(Table):
    """An OAuth provider: its token goes to `hosts` as a Bearer token (http_request's `connection`)."""

    name: Annotated[str, Says(f"must match {NAME.pattern} (e.g. 'github')")] = Field(
        pattern=NAME.pattern, description="the connection's name, e.g. 'github'")
    authorize_url: Endpoint | None = Field(None, description="the provider's consent page (https://); without it "
                                                             "calls that need the connection fail, never ask")
    token_url: Endpoint = Field(description="the provider's token endpoint (https://)")
    revoke_url: Endpoint | None = Field(None, description="the provider's revocation endpoint (https://, RFC 7009)")
    client_id: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = Field(
        description="the OAuth app's client id")
    client_secret_env: Annotated[str, AfterValidator(_variable)] | None = Field(
        None, description="the name of the environment variable holding the client secret (e.g. GITHUB_SECRET)")
    scopes: list[Annotated[str, Field(min_length=1), AfterValidator(_scope)]] = Field(
        [], description="a list of the scopes to ask for, one string each")
    hosts: list[Text] | None = Field(None, description="a list of the hosts its token may be sent to (*. allowed "
                                                       "below a domain); default: token_url's domain and below")
    owner: Literal["user", "shared"] = Field("user", description="'user' (each person connects their own) or "
                                                                 "'shared'")

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str] | None) -> list[str] | None:
        hosts, problem = parse_hosts(value)
        if problem is not None or not hosts:
            raise Problem(f": {problem or 'name at least one host'}")
        return hosts

    def spec(self, client_secret: str) -> ConnectionSpec:
        hosts = self.hosts if self.hosts is not None else default_hosts(URL(self.token_url).raw_host or "")
        return ConnectionSpec(name=self.name, token_url=self.token_url, client_id=self.client_id,
                              client_secret=client_secret, scopes=tuple(self.scopes), authorize_url=self.authorize_url,
                              revoke_url=self.revoke_url, hosts=tuple(hosts), owner=self.owner,
                              hosts_defaulted=self.hosts is None)
