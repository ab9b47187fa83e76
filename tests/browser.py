"""Where the browser tests find Chromium: Debian's package, driven by Playwright (never downloaded)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest


def chromium_or_skip() -> str:
    """Debian's chromium for Playwright, or skip (CI installs both and sets BOT_REQUIRE_BROWSER=1)."""
    chromium = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
    missing = importlib.util.find_spec("playwright") is None or not Path(chromium).exists()
    if missing and os.environ.get("BOT_REQUIRE_BROWSER") != "1":
        pytest.skip("needs Playwright and Debian's chromium (CI installs both)")
    return chromium
