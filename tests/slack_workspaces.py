"""Multi-workspace (OAuth) mode in tests: installs through the real install page, and requests as Slack sends
them from a given workspace."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qs, urlencode

from tests.conftest import GatewayClient
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import dumps, event_body, signed_headers


async def install_flow(gw: GatewayClient, fake_slack: FakeSlack, team: str) -> tuple[int, str]:
    """The install flow into ``team``, from the install page to Slack's redirect back: (status, page)."""
    fake_slack.redirect_to = f"{gw.base}/slack/oauth_redirect"
    async with gw.http.get(f"{gw.base}/slack/install") as resp:
        page = await resp.text()
        cookie = resp.headers.getall("Set-Cookie")[0].split(";")[0]
    found = re.search(r'href="([^"]+)">Add to Slack', page)
    assert found is not None
    link = found.group(1).replace("&amp;", "&") + f"&team={team}"  # the installer picks the workspace
    async with gw.http.get(link, allow_redirects=False) as resp:
        back = resp.headers["Location"]
    async with gw.http.get(back, headers={"Cookie": cookie}, allow_redirects=False) as resp:
        return resp.status, await resp.text()


async def install(gw: GatewayClient, fake_slack: FakeSlack, team: str) -> None:
    status, page = await install_flow(gw, fake_slack, team)
    assert status == 200, page


def in_team(team: str, body: dict[str, Any]) -> dict[str, Any]:
    """An Events API body as Slack sends it from workspace ``team``."""
    body["team_id"] = team
    body["authorizations"][0]["team_id"] = team
    if isinstance(body.get("event"), dict) and "team" in body["event"]:
        body["event"]["team"] = team
    return body


async def send(gw: GatewayClient, team: str, event: dict[str, Any]) -> int:
    body = dumps(in_team(team, event_body(event)))
    return (await gw.post_raw(body, signed_headers(body))).status


def form_in_team(team: str, form_body: str) -> str:
    """An interactivity (``payload=``) or slash-command form body from workspace ``team``."""
    if form_body.startswith("payload="):
        payload = json.loads(parse_qs(form_body)["payload"][0])
        payload["team"] = {"id": team}
        return urlencode({"payload": json.dumps(payload)})
    return form_body.replace("team_id=T1", f"team_id={team}")
