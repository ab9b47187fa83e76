"""A real browser (headless Chromium from Debian, driven by Playwright) against the real `bot run`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.bot_process import BotProcess

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
# CI installs Chromium and Playwright and sets this, so a missing browser fails there instead of skipping.
REQUIRED = os.environ.get("BOT_REQUIRE_BROWSER") == "1"
# Flags for a sandbox without network or GPU (see Debian's chromium as root).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "web-chat.png"

try:
    from playwright.async_api import async_playwright, expect
except ImportError:  # pragma: no cover - depends on the machine
    async_playwright = None  # type: ignore[assignment]

if not REQUIRED and (async_playwright is None or not Path(CHROMIUM).exists()):
    pytest.skip("needs Playwright and Debian's chromium (CI installs both)", allow_module_level=True)


async def test_chat_in_a_real_browser(tmp_path: Path, unused_port: int) -> None:
    bot = await BotProcess(tmp_path, {"PORT": str(unused_port)}).start()
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1100, "height": 720})
            await page.goto(bot.base + "/")
            await expect(page.get_by_role("heading", name="Ask the bot something")).to_be_visible()

            await page.get_by_label("Message").fill("what time is it?")
            await page.get_by_label("Message").press("Enter")
            answer = page.locator(".msg.assistant").last
            await expect(answer).to_contain_text("It is ", timeout=15_000)
            await expect(answer).to_contain_text("UTC")
            assert "/c/" in page.url

            await page.get_by_label("Message").fill("hello there")
            await page.get_by_role("button", name="Send").click()
            await expect(page.locator(".msg.assistant").last).to_contain_text("You said: hello there")

            # A gated tool: the approval card, the same broker as Slack, then the answer.
            await page.get_by_label("Message").fill("run `echo browser-approved`")
            await page.get_by_label("Message").press("Enter")
            card = page.locator(".msg.approval.pending")
            await expect(card).to_contain_text("shell_run", timeout=15_000)
            await expect(card).to_contain_text("echo browser-approved")
            await card.get_by_role("button", name="Approve").click()
            await expect(page.locator(".msg.approval.approved")).to_contain_text("Approved by web")
            await expect(page.locator(".msg.assistant").last).to_contain_text("browser-approved", timeout=15_000)

            await page.reload()
            await expect(page.locator(".msg.user")).to_have_count(3)
            await expect(page.locator(".msg.user").first).to_have_text("what time is it?")
            await expect(page.locator(".msg.assistant").last).to_contain_text("browser-approved")
            await expect(page.locator(".msg.approval.approved")).to_have_count(1)
            await expect(page.locator("#conversations a")).to_have_text(["what time is it?"])
            await page.screenshot(path=str(tmp_path / "web-chat.png"))
            if os.environ.get("UPDATE_SCREENSHOT") == "1":
                await page.screenshot(path=str(SCREENSHOT))

            # Phone-sized: the sidebar folds away and the conversation stays readable.
            phone = await browser.new_page(viewport={"width": 390, "height": 760})
            await phone.goto(page.url)
            await expect(phone.locator(".msg.user").first).to_be_visible()
            await expect(phone.locator("#sidebar")).not_to_be_in_viewport()
            await phone.get_by_role("button", name="Show conversations").click()
            await expect(phone.locator("#conversations a").first).to_be_in_viewport()
            await phone.screenshot(path=str(tmp_path / "web-chat-phone.png"))
            await browser.close()
        assert (tmp_path / "web-chat.png").stat().st_size > 10_000
    finally:
        assert await bot.terminate() == 0
