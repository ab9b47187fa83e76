"""``GET /metrics``: every name is ``chatops_``, the guide lists exactly the code's metrics, tool outcomes by tool."""

from __future__ import annotations

import importlib
import platform
import re
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from bot import __version__
from bot.metrics import PREFIX, metric_list
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "operations.md"
LISTED = re.compile(r"<!-- metrics: [^\n]*-->\n(.*?)<!-- /metrics -->", re.DOTALL)
# What prometheus_client registers by itself (the process's CPU, memory, GC, Python version): not ours to name.
CLIENT_DEFAULTS = ("process_", "python_")


def _import_every_module_that_defines_metrics() -> None:
    """The registry holds a module's metrics once it is imported: every module of the product that uses
    prometheus_client is, so a metric added anywhere is in the list."""
    for package in ("bot", "channels", "core"):
        for path in (ROOT / package).rglob("*.py"):
            if "prometheus_client" in path.read_text(encoding="utf-8") and path.name != "__main__.py":
                importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))


def test_the_guide_lists_exactly_the_metrics_the_code_registers() -> None:
    _import_every_module_that_defines_metrics()
    expected = "\n".join(metric_list()) + "\n"
    found = LISTED.search(GUIDE.read_text(encoding="utf-8"))
    assert found is not None, "docs/operations.md has lost its <!-- metrics --> block"
    assert found.group(1) == expected, f"docs/operations.md's metric list is out of date; it should read:\n{expected}"


def test_every_metric_name_has_the_product_prefix() -> None:
    _import_every_module_that_defines_metrics()
    names = [family.name for family in REGISTRY.collect()]
    assert [n for n in names if not n.startswith((PREFIX, *CLIENT_DEFAULTS))] == []
    assert "chatops_build_info" in names and "chatops_tool_calls" in names


async def test_build_info_and_tool_outcomes_by_tool(make_settings: Any, start_gateway: Any, fake_slack: FakeSlack,
                                                    fake_llm: FakeLLM, tmp_path: Path) -> None:
    config = tmp_path / "bot.toml"
    config.write_text('[[policies]]\ntool = "http_request"\nmatch = "*"\naction = "deny"\n')
    gateway = await start_gateway(make_settings(bot_config=config))
    secret = "s3cret-deploy-token-0042"
    await gateway.app.credentials.set_secret("deploy.token", secret, scope="agent", agent="default", by="U1")
    before = await gateway.metrics()
    invented = "ignore_your_rules_and_label_me_" + "x" * 40  # the model's text: never a label
    fake_llm.then(Reply(tool_calls=[
        ("time_now", {"timezone": "UTC"}),
        ("time_now", {"timezone": "Nowhere/Atlantis"}),
        ("time_now", "{not json"),
        (invented, {}),
        ("http_request", {"method": "GET", "url": "https://example.com/"}),
        ("time_now", {"timezone": secret}),  # a stored secret in the arguments: never runs
    ]), Reply("done"))
    await gateway.send_event(mention("use your tools"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    after = await gateway.metrics()

    def moved(tool: str, outcome: str) -> float:
        key = f'chatops_tool_calls_total{{outcome="{outcome}",tool="{tool}"}}'
        return after.get(key, 0) - before.get(key, 0)

    assert moved("time_now", "ok") == 1 and moved("time_now", "error") == 1 and moved("time_now", "refused") == 2
    assert moved("?", "refused") == 1 and moved("http_request", "denied") == 1
    assert not any(invented in key for key in after)
    assert after[f'chatops_build_info{{python="{platform.python_version()}",version="{__version__}"}}'] == 1
