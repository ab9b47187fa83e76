"""Step-up end to end in a real browser: Debian's Chromium (driven by Playwright, never downloaded) with the DevTools
virtual authenticator enrols a passkey through the one-time link, an approver clicks Approve in Slack (a signed
request to the bolt app), opens the step-up link they were told privately, confirms with the passkey, and the call
runs. Skipped like tests/test_web_browser.py when there is no browser (CI installs it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from yarl import URL

from tests.browser import chromium_or_skip
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
AUTHENTICATOR = {"protocol": "ctap2", "transport": "internal", "hasResidentKey": True, "hasUserVerification": True,
                 "isUserVerified": True}


async def test_enrol_then_confirm_an_approval_with_a_passkey_in_chromium(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    unused_port: int,
) -> None:
    chromium = chromium_or_skip()
    from playwright.async_api import async_playwright, expect

    public = f"http://localhost:{unused_port}"  # a host name (WebAuthn refuses an IP address), a secure context
    config = tmp_path / "bot.toml"
    config.write_text('[[policies]]\ntool = "shell_run"\napprovers = ["U7"]\nstep_up = true\ntimeout_s = 600\n')
    gateway = await start_gateway(make_settings(bot_config=config, bot_public_url=public, port=unused_port))
    passkeys = gateway.app.approvals.passkeys
    assert passkeys is not None
    enrol_link, _expires = await passkeys.enrol_link("slack:U7", by="operator:test")

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context()
            page = await context.new_page()
            devtools = await context.new_cdp_session(page)
            await devtools.send("WebAuthn.enable")
            added = await devtools.send("WebAuthn.addVirtualAuthenticator", {"options": AUTHENTICATOR})

            await page.goto(enrol_link)
            await page.get_by_role("button", name="Enrol a passkey").click()
            await expect(page.get_by_role("status")).to_contain_text("enrolled for slack:U7", timeout=15_000)
            stored = await devtools.send("WebAuthn.getCredentials", {"authenticatorId": added["authenticatorId"]})
            assert len(stored["credentials"]) == 1 and stored["credentials"][0]["isResidentCredential"]

            fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo passkey-approved"})]), Reply("done"))
            await gateway.send_event(mention("run it"))
            [card] = await fake_slack.wait_for("chat.postMessage")
            request_id = card.params["blocks"][-1]["elements"][0]["value"]
            await gateway.interact(block_action("approval:approve", request_id, user="U7"))
            [told] = await fake_slack.wait_for("chat.postEphemeral")
            found = re.search(re.escape(public) + r"/passkeys/step-up/[A-Za-z0-9_-]+", told.params["text"])
            assert found is not None and len(fake_llm.requests) == 1  # nothing ran before the passkey

            await page.goto(found.group(0))
            await expect(page.get_by_text("echo passkey-approved")).to_be_visible()
            await page.get_by_role("button", name="Confirm with my passkey").click()
            await expect(page.get_by_role("status")).to_contain_text("Confirmed with passkey", timeout=15_000)
            await fake_slack.wait_for("chat.postMessage", 2)
            await gateway.idle()
            assert "passkey-approved" in str(fake_llm.requests[1]["messages"][-1]["content"])

            # The link worked once. (Asked on a new connection: a browser's connection opened while the command
            # ran is refused by bot/sandbox_peers.py, whatever it asks.)
            async with gateway.http.get(gateway.base + URL(found.group(0)).path) as again:
                assert again.status == 410 and "already been used" in await again.text()
        finally:
            await browser.close()
