"""What a Slack tool's call will do, in words, for its approval card: the channel by name and kind, the people to
invite by name, the message to pin quoted. Looked up when the card is first shown (in the workspace in scope) and
kept with where the card landed, so the settled card says the same. Every argument is on the card as well."""

from __future__ import annotations

from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import TRANSPORT_ERRORS, error_code
from channels.slack.formatting import escape
from channels.slack.people import SlackPeople
from channels.slack.workspace_tools import find_message
from core.display import visible

QUOTE_CHARS = 1_500
_INVITEE = {"bot": ", an app", "guest": ", a guest", "external": ", from another organisation"}
EFFECT_TOOLS = frozenset({"channel_create", "channel_invite", "channel_archive", "message_pin"})


class ToolEffects:
    def __init__(self, client: AsyncWebClient, people: SlackPeople | None = None) -> None:
        self.client = client
        self.people = people or SlackPeople(client)

    async def describe(self, tool: str, args: dict[str, Any], *, team: str | None = None) -> str | None:
        """The call's effect as mrkdwn, None for a tool that is not one of these. ``team``: the conversation's
        workspace (whom an invitee is from another organisation relative to)."""
        if tool not in EFFECT_TOOLS:
            return None
        try:
            return await self._describe(tool, args, team)
        except (SlackApiError, *TRANSPORT_ERRORS) as exc:
            why = error_code(exc) if isinstance(exc, SlackApiError) else type(exc).__name__
            return f":warning: What this would do could not be looked up ({escape(why)}): read the arguments below."

    async def _describe(self, tool: str, args: dict[str, Any], team: str | None) -> str:
        if tool == "channel_create":
            name = str(args.get("name") or "").removeprefix("#")
            kind = "*private*" if args.get("private") else "*public* (anyone in the workspace can find and join it)"
            said = f"Create a {kind} channel *#{escape(name)}*"
            topic = args.get("topic")
            # The model's words, on one line and nothing invisible: they cannot pose as the card's own.
            said += f", with the topic “{escape(_one_line(str(topic)))}”." if topic else "."
            return said + " The people asking in this conversation join it."
        channel = await self._channel(str(args.get("channel") or ""))
        if tool == "channel_invite":
            people = [await self._person(str(u), team) for u in args.get("users") or []]
            return f"Invite {len(people)} {'person' if len(people) == 1 else 'people'} to {channel}: " + ", ".join(
                people) + "."
        if tool == "channel_archive":
            return (f"Archive {channel}: nobody can post in it any more; its messages stay readable, and it can be "
                    "unarchived.")
        channel_id = await self._channel_id(str(args.get("channel") or ""))
        message = await find_message(self.client, channel_id, str(args.get("ts") or "")) if channel_id else None
        if message is None:
            return f"Pin message {escape(str(args.get('ts')))} in {channel}: :warning: that message was not found."
        author = message.get("user")
        who = await self._person(str(author)) if isinstance(author, str) else "an app"
        text = str(message.get("text") or "")
        if len(text) > QUOTE_CHARS:
            text = text[:QUOTE_CHARS] + f" […{len(text) - QUOTE_CHARS:,} more characters]"
        quoted = "\n".join(f"> {escape(line)}" for line in (text or "(no text)").splitlines())
        return f"Pin this message by {who} in {channel}:\n{quoted}"

    async def _channel_id(self, given: str) -> str | None:
        if not given.startswith("#"):
            return given
        cursor: str | None = None
        for _page in range(20):
            response = await self.client.conversations_list(types="public_channel,private_channel",
                                                            exclude_archived=True, limit=1000, cursor=cursor)
            for item in response.get("channels") or []:
                if item.get("name") == given[1:].lower():
                    return str(item.get("id"))
            cursor = (response.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
        return None

    async def _channel(self, given: str) -> str:
        """``#name`` (id, public or private) as Slack has it, or what was given when it has none."""
        channel_id = await self._channel_id(given)
        if channel_id is None:
            return f"*{escape(given)}* (:warning: no such channel the bot can see)"
        try:
            info = (await self.client.conversations_info(channel=channel_id)).get("channel") or {}
        except SlackApiError as exc:
            return f"*{escape(given)}* (:warning: {escape(error_code(exc))})"
        name = info.get("name")
        kind = "private" if info.get("is_private") else "public"
        return f"*#{escape(str(name))}* ({escape(channel_id)}, {kind})" if name else f"*{escape(given)}*"

    async def _person(self, user: str, team: str | None = None) -> str:
        name = await self.people.name(user)
        if not name:
            return f"{escape(user)} (:warning: nobody by that id)"
        # An invitee that is an app (it reads the channel), a guest or an outsider is no colleague: the card says so,
        # whatever name it took.
        what = _INVITEE.get(await self.people.trust(user, team) or "", "")
        # Named, never mentioned: a card must not ping the people it is about.
        return f"*{escape(name)}* ({escape(user)}{what})"


def _one_line(text: str) -> str:
    return " ⏎ ".join(line.strip() for line in visible(text).splitlines() if line.strip())
