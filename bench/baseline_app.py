"""The baseline of SPEC §15: a bare slack-bolt AsyncApp that acks, calls the same fake model and posts
the answer, with an in-memory dedupe set and no database. Run: python -m bench.baseline_app"""

from __future__ import annotations

import os

from aiohttp import web
from openai import AsyncOpenAI
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient


def build() -> web.Application:
    client = AsyncWebClient(token=os.environ["SLACK_BOT_TOKEN"], base_url=os.environ["SLACK_API_URL"])
    app = AsyncApp(client=client, signing_secret=os.environ["SLACK_SIGNING_SECRET"])
    llm = AsyncOpenAI(base_url=os.environ["LLM_BASE_URL"], api_key="x", max_retries=0)
    seen: set[str] = set()

    noop = os.environ.get("BASELINE_NOOP") == "1"

    @app.event("app_mention")
    async def on_mention(body: dict, event: dict) -> None:  # type: ignore[type-arg]
        if noop:
            return
        if body["event_id"] in seen:
            return
        seen.add(body["event_id"])
        reply = await llm.chat.completions.create(
            model=os.environ["LLM_MODEL"], messages=[{"role": "user", "content": event["text"]}]
        )
        await client.chat_postMessage(channel=event["channel"], thread_ts=event.get("thread_ts") or event["ts"],
                                      text=reply.choices[0].message.content or "")

    async def events(request: web.Request) -> web.Response:
        return await to_aiohttp_response(await app.async_dispatch(await to_bolt_request(request)))

    web_app = web.Application()
    web_app.router.add_post("/slack/events", events)
    web_app.router.add_get("/healthz", lambda _r: web.json_response({"status": "ok"}))
    return web_app


if __name__ == "__main__":
    port = int(os.environ["PORT"])
    print(f"baseline: listening on http://127.0.0.1:{port}", flush=True)
    web.run_app(build(), host="127.0.0.1", port=port, print=None, access_log=None)
