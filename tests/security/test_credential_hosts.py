"""Point 3 (storing): a credential may carry `hosts`, where it may be sent. Set from the CLI, the Slack
modal, the web chat's form and the one-time link page; bad input is a field error and stores nothing.
(``http_request`` refusing other hosts is tested with the egress rules.)"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.credential_links import CredentialLinks
from core.credentials import CredentialService
from tests.bot_process import run_cli
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention, view_submission

CID = "0123456789abcdef0123456789abcdef"
BAD_HOSTS = [
    "https://api.github.com",  # a scheme
    "api.github.com/repos",  # a path
    "api.github.com:443",  # a port
    "[2001:db8::1]:443",
    "token@api.github.com",
    "*",  # everywhere is what no hosts means; a star is a mistake
    "*.com",  # a whole top-level domain
    "api.*.com",
    "*.*.example.com",
    "exa mple.com",
    "-bad.example.com",
    "a..b.example.com",
    "999.1.1.1",  # looks like an address, is not one
    "0x7f.0.0.1",
    "bücher.example",  # give the ASCII (xn--) form
    "api.github.com, a_b.example.com",  # one bad entry spoils the list
    "x" * 300,
]


async def _hosts(service: CredentialService) -> dict[str, Any]:
    return {r.name: json.loads(r.hosts) if r.hosts else None for r in await service.store.all_secrets()}


def test_hosts_are_normalised_and_bad_ones_explained() -> None:
    from core.hosts import parse_hosts

    assert parse_hosts("API.GitHub.com, *.Example.com ,api.github.com, 10.0.0.5, [2001:DB8::1], fd00::2") == (
        ["api.github.com", "*.example.com", "10.0.0.5", "2001:db8::1", "fd00::2"], None)
    assert parse_hosts(["api.github.com."]) == (["api.github.com"], None)
    assert parse_hosts("") == (None, None) and parse_hosts("  ") == (None, None) and parse_hosts(None) == (None, None)
    for bad in BAD_HOSTS:
        hosts, error = parse_hosts(bad)
        assert hosts is None and error, bad
    assert "without a scheme" in (parse_hosts("https://api.github.com")[1] or "")


@pytest.mark.parametrize("wildcard", [
    "*.co.uk", "*.github.io", "*.amazonaws.com", "*.s3.amazonaws.com", "*.compute.amazonaws.com",
    "*.herokuapp.com", "*.blogspot.com", "*.githubusercontent.com", "*.kawasaki.jp", "*.any.ck", "*.CO.UK.",
    "*.xn--55qx5d.cn",
])
def test_a_wildcard_over_names_anyone_can_register_is_refused(wildcard: str) -> None:
    """``*.github.io`` would send the credential to whoever registers ``evil.github.io``: a wildcard must not
    cover a public suffix (Public Suffix List, shipped with the package) or anything holding one."""
    from core.hosts import parse_hosts

    hosts, error = parse_hosts(f"api.example.com, {wildcard}")
    assert hosts is None and error is not None and "anyone can register" in error, (wildcard, error)
    assert wildcard not in error and "entry 2" in error  # named by its place: a pasted token is never echoed


def test_wildcards_below_a_registrable_domain_are_kept() -> None:
    from core.hosts import parse_hosts

    ok = ["*.example.com", "*.example.co.uk", "*.mine.github.io", "*.corp.internal", "*.city.kawasaki.jp",
          "*.bucket.s3.amazonaws.com"]
    assert parse_hosts(ok) == (ok, None)
    assert parse_hosts("co.uk, github.io") == (["co.uk", "github.io"], None)  # exact hosts are not wildcards


# -- the command line -------------------------------------------------------------------------------


async def _cli_set(tmp_path: Path, env: dict[str, str], *args: str, value: bytes) -> tuple[int, str]:
    return await run_cli(tmp_path, env, "credentials", "set", *args, stdin=value)


async def test_hosts_from_the_command_line(tmp_path: Path) -> None:
    env = {"BOT_SECRET_KEYS": f"k1:{base64.b64encode(os.urandom(32)).decode()}"}
    code, out = await _cli_set(tmp_path, env, "gh.token", "--host", "https://api.github.com/", value=b"cli-v-1\n")
    assert code == 2 and "entry 1 is not a host" in out and "without a scheme" in out and "cli-v-1" not in out
    code, out = await run_cli(tmp_path, env, "credentials", "list")
    assert code == 0 and "no stored credentials" in out  # nothing was stored

    code, out = await _cli_set(tmp_path, env, "gh.token", "--host", "api.github.com", "--host", "*.GitHub.com",
                               value=b"cli-v-2\n")
    assert code == 0 and "stored gh.token" in out and "api.github.com" in out and "cli-v-2" not in out
    await _cli_set(tmp_path, env, "free.token", value=b"cli-v-3\n")
    code, out = await run_cli(tmp_path, env, "credentials", "list")
    lines = {line.split("\t", 1)[0]: line for line in out.splitlines()}
    assert "hosts api.github.com, *.github.com" in lines["gh.token"]
    assert "hosts any" in lines["free.token"] and "cli-v" not in out


# -- the Slack modal --------------------------------------------------------------------------------


def _values(value: str, hosts: str | None) -> dict[str, Any]:
    return {"value": {"value": {"type": "plain_text_input", "value": value}},
            "hosts": {"hosts": {"type": "plain_text_input", "value": hosts}}}


async def _submit(gateway: GatewayClient, request_id: str, value: str, hosts: str | None) -> dict[str, Any]:
    resp = await gateway.interact(view_submission("credential_provide", request_id, _values(value, hosts)))
    assert resp.status == 200
    body = await resp.text()
    return json.loads(body) if body else {}


async def _slack_request(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, name: str) -> str:
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": name, "reason": "to call GitHub"})]),
                  Reply("thanks"))
    await gateway.send_event(mention("check GitHub"))
    message = (await fake_slack.wait_for("chat.postMessage"))[0]
    return str(message.params["blocks"][-1]["elements"][0]["value"])


async def test_hosts_from_the_slack_modal(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    request_id = await _slack_request(gateway, fake_slack, fake_llm, "gh.token")
    await gateway.interact(block_action("credential:provide", request_id))
    modal = (await fake_slack.wait_for("views.open"))[0].params["view"]
    modal = json.loads(modal) if isinstance(modal, str) else modal
    field = next(b for b in modal["blocks"] if b.get("block_id") == "hosts")
    assert field["type"] == "input" and field["optional"] is True
    assert field["label"]["text"] == "Allowed hosts (comma-separated)"
    assert field["element"] == {**field["element"], "type": "plain_text_input", "action_id": "hosts"}

    for bad in ("https://api.github.com", "api.github.com:443", "*"):
        answer = await _submit(gateway, request_id, "slack-v-1", bad)
        assert answer["response_action"] == "errors" and set(answer["errors"]) == {"hosts"}, answer
        assert "slack-v-1" not in json.dumps(answer)
    assert await gateway.app.credentials.store.all_secrets() == []  # nothing stored, the request is open
    assert (await gateway.app.credentials.get(int(request_id))).status == "pending"  # type: ignore[union-attr]

    assert await _submit(gateway, request_id, "slack-v-1", " api.github.com, *.github.com ") == {}
    assert await _hosts(gateway.app.credentials) == {"gh.token": ["api.github.com", "*.github.com"]}


@pytest.mark.parametrize(("value", "hosts"), [
    ("sk-live-abcdef1234567890", "sk-live-abcdef1234567890"),  # the value pasted into both fields
    ("sk-live-abcdef1234567890", "api.github.com, sk-live-abcdef1234567890"),
    ("v-other-1", "xoxb-1234-5678-abcdefghijkl"),  # some other token: one word, not a host name
    ("v-other-1", "0123456789abcdef0123456789abcdef01234567"),  # a hex token
    ("v-other-1", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r"),  # a JWT: no word at the end
    ("v-other-1", "vault"),  # a single label: a name the egress policy cannot place
])
async def test_a_secret_pasted_into_the_hosts_field_is_a_field_error_never_stored_text(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, value: str, hosts: str,
) -> None:
    # Hosts are stored in clear: before this, each of these was kept as an "allowed host" (review point 8).
    request_id = await _slack_request(gateway, fake_slack, fake_llm, "gh.token")
    answer = await _submit(gateway, request_id, value, hosts)
    assert answer["response_action"] == "errors" and set(answer["errors"]) == {"hosts"}, answer
    assert value not in json.dumps(answer) and hosts.split(", ")[-1] not in json.dumps(answer)  # never quoted back
    assert await gateway.app.credentials.store.all_secrets() == []
    assert (await gateway.app.credentials.get(int(request_id))).status == "pending"  # type: ignore[union-attr]
    assert await _submit(gateway, request_id, value, "api.github.com, localhost") == {}
    assert await _hosts(gateway.app.credentials) == {"gh.token": ["api.github.com", "localhost"]}


async def test_an_empty_hosts_field_in_the_modal_means_anywhere(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    request_id = await _slack_request(gateway, fake_slack, fake_llm, "any.token")
    assert await _submit(gateway, request_id, "slack-v-2", None) == {}  # Slack sends null for an empty input
    assert await _hosts(gateway.app.credentials) == {"any.token": None}


# -- the web chat's form and the one-time link page ------------------------------------------------


async def _post(gw: GatewayClient, path: str, body: Any) -> tuple[int, Any]:
    async with gw.http.post(f"{gw.base}{path}", json=body) as resp:
        return resp.status, await resp.json()


async def _web_request(gateway: GatewayClient, fake_llm: FakeLLM, name: str) -> int:
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": name, "reason": "to call GitHub"})]),
                  Reply("thanks"))
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "check GitHub"})
    async with asyncio.timeout(10):
        while True:
            async with gateway.http.get(f"{gateway.base}/api/conversations/{CID}") as resp:
                pending = [c for c in (await resp.json())["credentials"] if c["status"] == "pending"]
            if pending:
                return int(pending[0]["id"])
            await asyncio.sleep(0.02)


async def test_hosts_from_the_web_chat_form(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    request_id = await _web_request(gateway, fake_llm, "gh.token")
    path = f"/api/credentials/{request_id}"
    for bad in ("api.github.com/x", ["api.github.com", "ftp://x"], 5, [7]):
        status, body = await _post(gateway, path, {"value": "web-v-1", "hosts": bad})
        assert status == 400 and body["stored"] is False and body["field"] == "hosts" and body["field_error"], bad
        assert "web-v-1" not in json.dumps(body)
    assert await gateway.app.credentials.store.all_secrets() == []
    status, body = await _post(gateway, path, {"value": "web-v-1", "hosts": "api.github.com, 203.0.113.7"})
    assert (status, body["stored"]) == (200, True)
    assert await _hosts(gateway.app.credentials) == {"gh.token": ["api.github.com", "203.0.113.7"]}

    async with gateway.http.get(f"{gateway.base}/static/app.js") as resp:
        script = await resp.text()
    assert "Allowed hosts" in script and "hosts:" in script  # the form has the field and sends it


async def test_hosts_from_the_one_time_link_page(gateway: GatewayClient, fake_slack: FakeSlack,
                                                 fake_llm: FakeLLM) -> None:
    await _slack_request(gateway, fake_slack, fake_llm, "gh.token")
    credentials = gateway.app.credentials
    token = await CredentialLinks(credentials).create_link((await credentials.store.pending())[0].id)
    url = f"{gateway.base}/credentials/{token}"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            page = await resp.text()
            assert resp.status == 200 and 'name="hosts"' in page and "Allowed hosts" in page
        async with http.post(url, data={"value": "link-v-1", "hosts": "api.github.com:443"}) as resp:
            page = await resp.text()
            assert resp.status == 400 and "without a scheme" in page and "link-v-1" not in page
        assert await credentials.store.all_secrets() == []
        async with http.post(url, data={"value": "link-v-1", "hosts": "api.github.com"}) as resp:
            assert resp.status == 200  # the bad try did not use up the link
    assert await _hosts(credentials) == {"gh.token": ["api.github.com"]}


@pytest.mark.parametrize("hosts", ["", None])
async def test_set_secret_without_hosts_stores_none(gateway: GatewayClient, hosts: str | None) -> None:
    await gateway.app.credentials.set_secret("plain.token", "v-plain-1", scope="agent", agent="default", by="U1",
                                             hosts=hosts)
    assert await _hosts(gateway.app.credentials) == {"plain.token": None}
