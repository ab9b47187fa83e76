"""Step-up approvals (SPEC §17 ``step_up``, issue 40.5) through the real Slack app and the bot's own passkey pages,
with a passkey authenticator in Python (tests/passkey_authenticator.py): an Approve click counts only once the
approver confirms it with their passkey; the link works once, for that approver's passkeys only, and not after the
request settled or the link expired; no passkey means being told how to enrol, and the card waits."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from bot.app import build_application
from bot.errors import SettingsError
from bot.logs import QUIET_LIBRARIES
from core.passkeys import RelyingParty, relying_party
from tests.audit import audit_log
from tests.bot_process import run_cli
from tests.conftest import GatewayClient
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.passkey_authenticator import SoftAuthenticator, b64
from tests.slack_requests import block_action, mention

ORIGIN = "http://localhost"  # BOT_PUBLIC_URL here: the pages are reached at 127.0.0.1:<port>, the origin is this
RULE = '[[policies]]\ntool = "shell_run"\napprovers = ["U7", "U8"]\nstep_up = true\ntimeout_s = 3600\n'
_LINK = re.compile(r"http://localhost/passkeys/step-up/[A-Za-z0-9_-]+")


class PasskeyBrowser:
    """A browser on the passkey pages: it keeps their cookies and posts what their script posts."""

    def __init__(self, gateway: GatewayClient) -> None:
        self.base = gateway.base
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # 127.0.0.1 keeps cookies
        self.form = ""

    async def open(self, link: str) -> tuple[int, str, dict[str, str]]:
        async with self.http.get(self.base + URL(link).path) as resp:
            text = await resp.text()
            found = re.search(r'data-form="([^"]+)"', text)
            self.form = found.group(1) if found else ""
            return resp.status, text, dict(resp.headers)

    async def post(self, link: str, step: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
        async with self.http.post(f"{self.base}{URL(link).path}/{step}", data=json.dumps({"form": self.form, **body}),
                                  headers={"Content-Type": "application/json", **headers}) as resp:
            return resp.status, await resp.json()

    async def enrol(self, link: str, authenticator: SoftAuthenticator) -> tuple[int, dict[str, Any]]:
        status, _text, _headers = await self.open(link)
        assert status == 200
        status, options = await self.post(link, "options", {})
        assert status == 200, options
        return await self.post(link, "finish", {"credential": authenticator.create(options["options"])})

    async def options(self, link: str) -> dict[str, Any]:
        status, _text, _headers = await self.open(link)
        assert status == 200, _text
        status, options = await self.post(link, "options", {})
        assert status == 200, options
        return dict(options["options"])

    async def close(self) -> None:
        await self.http.close()


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, clock: Any = None,
                 rule: str = RULE) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rule)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, bot_public_url=ORIGIN), clock=clock)
    return gateway


async def _enrolled(gateway: GatewayClient, browser: PasskeyBrowser, owner: str, *,
                    sign_count: int = 0) -> SoftAuthenticator:
    passkeys = gateway.app.approvals.passkeys
    assert passkeys is not None
    link, _expires = await passkeys.enrol_link(owner, by="operator:test")
    authenticator = SoftAuthenticator(ORIGIN, sign_count=sign_count)
    status, body = await browser.enrol(link, authenticator)
    assert status == 200 and "enrolled for " + owner in body["message"]
    return authenticator


async def _asked(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, command: str) -> str:
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": command})]), Reply("done"))
    await gateway.send_event(mention("run it"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    return str(card.params["blocks"][-1]["elements"][0]["value"])


async def _link(gateway: GatewayClient, fake_slack: FakeSlack, request_id: str, user: str, told: int) -> str:
    """``user`` clicks Approve: the ephemeral reply (the ``told``-th) carries their one-time link."""
    await gateway.interact(block_action("approval:approve", request_id, user=user))
    text = str((await fake_slack.wait_for("chat.postEphemeral", told))[told - 1].params["text"])
    found = _LINK.search(text)
    assert found is not None, text
    return found.group(0)


async def test_an_approval_counts_once_confirmed_with_the_approvers_passkey_and_the_link_works_once(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = await _start(make_settings, start_gateway, tmp_path)
    browser = PasskeyBrowser(gateway)
    try:
        authenticator = await _enrolled(gateway, browser, "slack:U7")
        request_id = await _asked(gateway, fake_slack, fake_llm, "echo stepped-up")
        link = await _link(gateway, fake_slack, request_id, "U7", 1)
        assert [c.params["user"] for c in fake_slack.of("chat.postEphemeral")] == ["U7"]  # only to them
        assert not any(link in json.dumps(c.params) for c in fake_slack.of("chat.postMessage"))  # never the thread
        assert not fake_slack.of("chat.update") and len(fake_llm.requests) == 1  # nothing counted, nothing ran
        assert "approving needs a passkey" in json.dumps(fake_slack.of("chat.postMessage")[0].params["blocks"])

        status, page, headers = await browser.open(link)
        assert status == 200 and "echo stepped-up" in page and "passkeys.js" in page
        assert headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        status, options = await browser.post(link, "options", {})
        assert options["options"]["userVerification"] == "required"
        assert [c["id"] for c in options["options"]["allowCredentials"]] == [b64(authenticator.credential_id)]
        answer = authenticator.get(options["options"])
        status, done = await browser.post(link, "finish", {"credential": answer})
        assert status == 200 and "Confirmed with passkey 1" in done["message"], done
        await fake_slack.wait_for("chat.postMessage", 2)
        await gateway.idle()
        assert "stepped-up" in str(fake_llm.requests[1]["messages"][-1]["content"])  # the call ran
        audit = await audit_log(gateway.app.approvals.store.db)
        step_up = next(row for row in audit if row.action == "approval.step_up")
        assert "step-up confirmed with passkey 1" in str(step_up.detail) and step_up.actor == "slack:U7"
        assert [row.action for row in audit].count("approval.approved") <= 1

        # Replayed: the same answer, and the page again.
        status, again = await browser.post(link, "finish", {"credential": answer})
        assert status in (403, 409, 410) and "Confirmed" not in again["message"]
        status, page, _ = await browser.open(link)
        assert status == 410 and ("already been used" in page or "closed" in page)
        # The token is never logged (libraries' debug lines are held at WARNING by bot.logs, as in production).
        ours = [r.getMessage() for r in caplog.records if not r.name.startswith(QUIET_LIBRARIES)]
        assert ours and not any(URL(link).name in line for line in ours)
    finally:
        await browser.close()


async def test_with_a_quorum_each_approval_counts_once_its_approver_confirmed_it(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, rule=RULE.replace("step_up", "quorum = 2\nstep_up"))
    browser = PasskeyBrowser(gateway)
    try:
        keys = {user: await _enrolled(gateway, browser, f"slack:{user}") for user in ("U7", "U8")}
        request_id = await _asked(gateway, fake_slack, fake_llm, "echo two-passkeys")
        first = await _link(gateway, fake_slack, request_id, "U7", 1)
        second = await _link(gateway, fake_slack, request_id, "U8", 2)
        answer = keys["U7"].get(await browser.options(first))
        status, done = await browser.post(first, "finish", {"credential": answer})
        assert status == 200 and "Your approval is counted: 1 of 2 approvals — U7" in done["message"], done
        assert len(fake_llm.requests) == 1
        answer = keys["U8"].get(await browser.options(second))
        status, done = await browser.post(second, "finish", {"credential": answer})
        assert status == 200 and "Approved by U7 and U8" in done["message"], done
        await fake_slack.wait_for("chat.postMessage", 2)
        await gateway.idle()
        assert "two-passkeys" in str(fake_llm.requests[1]["messages"][-1]["content"])
        audit = [row for row in await audit_log(gateway.app.approvals.store.db) if row.action == "approval.step_up"]
        assert [row.actor for row in audit] == ["slack:U7", "slack:U8"]
    finally:
        await browser.close()


async def test_without_a_passkey_the_approver_is_told_how_to_enrol_and_the_card_waits(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    request_id = await _asked(gateway, fake_slack, fake_llm, "echo no-passkey")
    await gateway.interact(block_action("approval:approve", request_id, user="U8"))
    [told] = await fake_slack.wait_for("chat.postEphemeral")
    assert told.params["user"] == "U8" and "bot approvers enroll slack:U8" in told.params["text"]
    assert "/passkeys/" not in told.params["text"]
    request = await gateway.app.approvals.get(int(request_id))
    assert request is not None and not request.settled and request.approved_by == ()
    assert not fake_slack.of("chat.update") and len(fake_llm.requests) == 1

    # Deny needs no passkey.
    await gateway.interact(block_action("approval:deny", request_id, user="U8"))
    result = await gateway.app.gateway.decide(int(request_id), "deny", by="U8", channel="slack")
    assert result.won and result.request is not None and result.request.status == "denied"


async def test_a_link_refuses_another_approvers_passkey_a_forged_challenge_another_origin_and_other_sites(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    browser = PasskeyBrowser(gateway)
    try:
        mine = await _enrolled(gateway, browser, "slack:U7", sign_count=5)  # the authenticator has counted to 5
        theirs = await _enrolled(gateway, browser, "slack:U8")
        request_id = await _asked(gateway, fake_slack, fake_llm, "echo guarded")
        told = 0

        async def refused(answer: Any, expect: str) -> None:
            nonlocal told
            told += 1
            link = await _link(gateway, fake_slack, request_id, "U7", told)
            options = await browser.options(link)
            status, body = await browser.post(link, "finish", {"credential": answer(options)})
            assert status == 409 and expect in body["message"], body
            status, _page, _ = await browser.open(link)
            assert status == 410  # used up by the failed try

        await refused(lambda o: theirs.get(o), "not one of yours")  # U8's passkey on U7's link
        await refused(lambda o: mine.get(o, challenge="Zm9yZ2VkLWNoYWxsZW5nZQ"), "could not be verified")
        await refused(lambda o: mine.get(o, origin="https://evil.example"), "could not be verified")
        await refused(lambda o: mine.get(o, verified=False), "could not be verified")  # no user verification
        await refused(lambda o: mine.get(o, count=3), "could not be verified")  # its sign count went back
        await refused(lambda o: {**mine.get(o), "response": {"signature": 7}}, "could not be verified")  # garbage

        # Enrolling a passkey id someone already has (the browser names it: no attestation) is refused.
        passkeys = gateway.app.approvals.passkeys
        assert passkeys is not None
        copycat = SoftAuthenticator(ORIGIN, credential_id=theirs.credential_id)
        status, body = await browser.enrol((await passkeys.enrol_link("slack:U7", by="operator:test"))[0], copycat)
        assert status == 409 and "already enrolled" in body["message"]

        told += 1
        link = await _link(gateway, fake_slack, request_id, "U7", told)
        await browser.open(link)
        status, body = await browser.post(link, "options", {}, **{"Sec-Fetch-Site": "cross-site"})
        assert status == 403
        stranger = PasskeyBrowser(gateway)  # the link, but not the page's cookie: another site's post
        try:
            stranger.form = browser.form
            status, body = await stranger.post(link, "options", {})
            assert status == 403 and "bot's own page" in body["message"]
        finally:
            await stranger.close()
        request = await gateway.app.approvals.get(int(request_id))
        assert request is not None and not request.settled and len(fake_llm.requests) == 1  # still nothing counted
        audit = [row.action for row in await audit_log(gateway.app.approvals.store.db)]
        assert "approval.step_up" not in audit

        # A revoked passkey confirms nothing: its owner is told to enrol again.
        assert [(k.id, k.owner) for k in await passkeys.listed()] == [(1, "slack:U7"), (2, "slack:U8")]
        revoked = await passkeys.revoke(1, by="operator:test")
        assert revoked is not None and revoked.owner == "slack:U7"
        await gateway.interact(block_action("approval:approve", request_id, user="U7"))
        told_now = await fake_slack.wait_for("chat.postEphemeral", told + 1)
        assert "bot approvers enroll slack:U7" in told_now[-1].params["text"]
    finally:
        await browser.close()


async def test_a_link_is_refused_once_the_request_is_settled_or_the_link_expired(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    clock = ShiftedClock()
    gateway = await _start(make_settings, start_gateway, tmp_path, clock=clock)
    browser = PasskeyBrowser(gateway)
    try:
        mine = await _enrolled(gateway, browser, "slack:U7")
        request_id = await _asked(gateway, fake_slack, fake_llm, "echo late")
        stale = await _link(gateway, fake_slack, request_id, "U7", 1)
        options = await browser.options(stale)
        clock.jump_to(clock.now() + timedelta(minutes=16))  # the link's 15 minutes are over; the request's hour is not
        status, body = await browser.post(stale, "finish", {"credential": mine.get(options)})
        assert status == 410 and "expired" in body["message"]
        status, page, _ = await browser.open(stale)
        assert status == 410 and "expired" in page

        fresh = await _link(gateway, fake_slack, request_id, "U7", 2)
        options = await browser.options(fresh)
        denied = await gateway.app.gateway.decide(int(request_id), "deny", by="U8", channel="slack")
        assert denied.won
        status, body = await browser.post(fresh, "finish", {"credential": mine.get(options)})
        assert status == 410 and "closed" in body["message"]
        request = await gateway.app.approvals.get(int(request_id))
        assert request is not None and request.status == "denied"
    finally:
        await browser.close()


def test_the_relying_party_is_bot_public_url_with_a_host_name() -> None:
    assert relying_party("https://bot.example.com/base/") == RelyingParty(
        id="bot.example.com", origin="https://bot.example.com", base_url="https://bot.example.com/base")
    assert relying_party("http://localhost:8080") == RelyingParty(
        id="localhost", origin="http://localhost:8080", base_url="http://localhost:8080")
    for refused, why in ((None, "not set"), ("https://10.0.0.5", "IP address"), ("https://[::1]:8443", "IP address"),
                         ("http://bot.example.com", "neither https"), ("http://127.0.0.1:8080", "IP address")):
        problem = relying_party(refused)
        assert isinstance(problem, str) and why in problem, problem


@pytest.mark.parametrize("public_url", [None, "http://127.0.0.1:3000"])
def test_start_refuses_a_step_up_rule_without_a_host_name(make_settings: Any, tmp_path: Path,
                                                          public_url: str | None) -> None:
    config = tmp_path / "bot.toml"
    config.write_text(RULE)
    with pytest.raises(SettingsError) as refused:
        build_application(make_settings(bot_config=config, bot_public_url=public_url))
    assert "step_up" in str(refused.value) and "\n" not in str(refused.value)


async def test_bot_approvers_enroll_prints_a_one_time_link_for_one_person(tmp_path: Path) -> None:
    env = {"BOT_PUBLIC_URL": "https://bot.example.com"}
    code, out = await run_cli(tmp_path, env, "approvers", "enroll", "U7")
    assert code == 0 and "for slack:U7" in out, out
    found = re.search(r"https://bot\.example\.com/passkeys/enrol/[A-Za-z0-9_-]{40,}", out)
    assert found is not None
    code, out = await run_cli(tmp_path, env, "approvers", "enroll", "web")
    assert code == 0 and "for web:web" in out
    for group in ("S123", "requester"):
        code, out = await run_cli(tmp_path, env, "approvers", "enroll", group)
        assert code == 2 and "is not one person" in out
    code, out = await run_cli(tmp_path, env, "approvers", "list")
    assert code == 0 and "no passkeys enrolled" in out
    code, out = await run_cli(tmp_path, env, "approvers", "revoke", "9")
    assert code == 3 and "no active passkey 9" in out
    code, out = await run_cli(tmp_path, {"BOT_PUBLIC_URL": "http://10.1.2.3:3000"}, "approvers", "enroll", "U7")
    assert code == 2 and "BOT_PUBLIC_URL" in out and "/passkeys/" not in out


def test_doctor_names_a_step_up_rule_without_a_host_name(make_settings: Any, tmp_path: Path) -> None:
    from bot.doctor import _config_file

    config = tmp_path / "bot.toml"
    config.write_text(RULE)
    [failed] = [c for c in _config_file(make_settings(bot_config=config, bot_public_url="https://10.0.0.5"))
                if c.name == "step-up"]
    assert not failed.ok and "IP address" in failed.detail
    assert not [c for c in _config_file(make_settings(bot_config=config, bot_public_url=ORIGIN)) if c.name == "step-up"]

