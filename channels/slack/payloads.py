"""The shapes of Slack payloads, checked once before bolt or a listener looks inside.

A signed payload that does not have the shape Slack documents is answered 400 and nothing in it is
used: bolt and our listeners index into payloads, and an odd shape would otherwise become a 500 (which
Slack retries). Ids are checked here too, because they become session ids and places
(``slack:T:C:ts``): ``C1:evil`` or ``../`` must never get that far.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeGuard

from core.model import Attachment

SLACK_ID = re.compile(r"[A-Z0-9]{1,32}")  # team, enterprise, channel, user, bot and group ids
PERSON = re.compile(r"[UWS][A-Z0-9]+")  # a user (U…, W… on Enterprise Grid) or a user group (S…)
TS = re.compile(r"[0-9]{1,16}\.[0-9]{1,16}")  # a message timestamp, "1712345678.123456"
_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,128}")  # trigger ids, event ids, action ids from our own blocks
# Message subtypes that are a person talking; every other subtype (edits, joins, bots…) is ignored.
PERSON_SUBTYPES = {None, "file_share", "thread_broadcast"}

Check = Callable[[dict[str, Any]], str | None]


def slack_person(entry: str) -> str | None:
    """The Slack user or group id a configured approver names (``U1`` or ``slack:U1``); None for anyone else:
    ``requester``, the web chat's ``web``, another channel's ``testchat:U1``, who are no one to mention or DM."""
    ident = entry.removeprefix("slack:")
    return ident if PERSON.fullmatch(ident) is not None else None


def shape_problem(body: Any) -> str | None:
    """What is wrong with a payload's shape, or None when bolt and our listeners may read it."""
    if not isinstance(body, dict):
        return "the body is not an object"
    problem = _common(body)
    if problem is not None:
        return problem
    if "command" in body:  # how bolt recognises a slash command
        return _command(body)
    check = _BY_TYPE.get(body.get("type"))  # type: ignore[arg-type]
    return check(body) if check is not None else None


def is_id(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and SLACK_ID.fullmatch(value) is not None


def is_ts(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and TS.fullmatch(value) is not None


def user_id(body: dict[str, Any]) -> str:
    """The acting user of an interactivity payload ("" if absent; the shape check already refused odd ones)."""
    user = body.get("user")
    value = user.get("id") if isinstance(user, dict) else None
    return value if is_id(value) else ""


def channel_id(body: dict[str, Any]) -> str:
    """The channel an interaction happened in ("" when none, e.g. a click inside a modal)."""
    channel = body.get("channel")
    value = channel.get("id") if isinstance(channel, dict) else None
    return value if is_id(value) else ""


def team_id(body: dict[str, Any]) -> str:
    """The workspace an interaction or event is served in ("" if absent or not an id). For an Events API body,
    the installation it was delivered to (``authorizations[0]``, as bolt authorizes it): in a channel shared
    with another organisation ``team_id`` may name theirs."""
    authorizations = body.get("authorizations")
    if isinstance(authorizations, list) and authorizations and isinstance(authorizations[0], dict) \
            and is_id(authorizations[0].get("team_id")):
        return str(authorizations[0]["team_id"])
    team = body.get("team")
    value = team.get("id") if isinstance(team, dict) else body.get("team_id")
    return value if is_id(value) else ""


def thread_session(team: str, channel: str, thread_ts: str) -> str:
    """The session id of a Slack thread: one conversation per thread (what the adapter's intake uses)."""
    return f"slack:{team}:{channel}:{thread_ts}"


def clicked_ts(body: dict[str, Any]) -> str | None:
    """The thread ts of a clicked (or shortcut) message: its thread's, else its own (a thread's first message)."""
    message, container = body.get("message"), body.get("container")
    message = message if isinstance(message, dict) else {}
    container = container if isinstance(container, dict) else {}
    for candidate in (message.get("thread_ts"), container.get("thread_ts"), message.get("ts"),
                      container.get("message_ts")):
        if is_ts(candidate):
            return candidate
    return None


def clicked_thread(body: dict[str, Any]) -> str | None:
    """The session of the thread a clicked (or shortcut) message is in, or None when it is not a person's
    interaction in a channel's thread or top-level message. The team is the payload's (an org-wide install
    sends none: then the clicking user's)."""
    user = body.get("user")
    team = team_id(body) or (user.get("team_id") if isinstance(user, dict) and is_id(user.get("team_id")) else "")
    channel, thread_ts = channel_id(body), clicked_ts(body)
    if not (team and channel and thread_ts):
        return None
    return thread_session(team, channel, thread_ts)


MAX_FILES = 10  # Slack shares at most ten files with one message


def shared_files(files: Any) -> tuple[Attachment, ...]:
    """The files shared with a message (``event.files``), as core's attachments: name, type, declared size and
    the private download URL (fetched later, by the port, only from Slack's file host). Odd entries are named
    as what they say they are, with nothing to fetch."""
    if not isinstance(files, list):
        return ()
    found = []
    for item in files[:MAX_FILES]:
        if not isinstance(item, dict):
            continue
        name, mimetype, size = item.get("name") or item.get("title"), item.get("mimetype"), item.get("size")
        url = item.get("url_private_download") or item.get("url_private")
        file_id = item.get("id")
        # Only a file Slack hosts, shared in full, and whose URL is its own: an external (remote) file's URL
        # is whatever the app that added it said, and a file Slack withholds has none worth asking for.
        if item.get("is_external") or item.get("mode") not in (None, "hosted", "snippet", "post") \
                or item.get("file_access") == "check_file_info" or not is_id(file_id) \
                or not isinstance(url, str) or file_id not in url:
            url = ""
        found.append(Attachment(
            name=name[:255] if isinstance(name, str) and name else "(unnamed file)",
            mimetype=mimetype[:255] if isinstance(mimetype, str) else "",
            size=size if type(size) is int and size >= 0 else None,
            source=url if len(url) <= 2048 else "",
        ))
    return tuple(found)


def input_value(view: dict[str, Any], block: str, element: str) -> str:
    """What was typed into one plain-text input of a submitted view ("" when empty or absent)."""
    state = view.get("state")
    values = state.get("values") if isinstance(state, dict) else None
    field = values.get(block) if isinstance(values, dict) else None
    item = field.get(element) if isinstance(field, dict) else None
    text = item.get("value") if isinstance(item, dict) else None
    return text if isinstance(text, str) else ""


# -- the checks -----------------------------------------------------------------------------------


def _common(body: dict[str, Any]) -> str | None:
    """What bolt reads from any payload before it knows which listener it is for."""
    for name, rule in (("type", _string), ("team_id", _id), ("user_id", _id), ("channel_id", _id),
                       ("enterprise_id", _string), ("trigger_id", _token), ("response_url", _string),
                       ("team", _team), ("enterprise", _team), ("user", _object_with_id),
                       ("channel", _object_with_id), ("event", _object), ("view", _object),
                       ("container", _object), ("message", _object), ("actions", _objects),
                       ("authorizations", _objects), ("response_urls", _objects)):
        if body.get(name) is not None and not rule(body[name]):
            return f"{name} is not what Slack sends"
    for item in body.get("authorizations") or ():
        for name in ("team_id", "user_id"):
            if item.get(name) is not None and not is_id(item[name]):
                return f"authorizations.{name} is not a Slack id"
    view = body.get("view")
    if isinstance(view, dict):
        for name in ("team_id", "app_installed_team_id"):
            if view.get(name) is not None and not is_id(view[name]):
                return f"view.{name} is not a Slack id"
    return None


def _event_callback(body: dict[str, Any]) -> str | None:
    event = body.get("event")
    if not isinstance(event, dict):
        return "event is not an object"
    if not isinstance(event.get("type"), str):
        return "event.type is not a string"
    if body.get("event_id") is not None and not _token(body["event_id"]):
        return "event_id is not what Slack sends"
    if event["type"] not in ("message", "app_mention"):
        # Events we do not listen to: only what bolt itself reads from them.
        for name in ("user", "channel"):
            if event.get(name) is not None and not isinstance(event[name], (str, dict)):
                return f"event.{name} is not what Slack sends"
        return None
    for name, rule in (("user", _id), ("channel", _id), ("team", _id), ("user_team", _id), ("bot_id", _id),
                       ("ts", _ts), ("thread_ts", _ts), ("event_ts", _ts), ("text", _string),
                       ("subtype", _string), ("channel_type", _string), ("files", _objects),
                       ("blocks", _objects), ("attachments", _objects), ("bot_profile", _object),
                       ("message", _object), ("previous_message", _object), ("edited", _object)):
        if event.get(name) is not None and not rule(event[name]):
            return f"event.{name} is not what Slack sends"
    if event.get("subtype") in PERSON_SUBTYPES and not event.get("bot_id"):
        for name in ("user", "channel", "ts"):  # a person's message always says who, where and when
            if event.get(name) is None:
                return f"event.{name} is missing"
    return None


def _block_actions(body: dict[str, Any]) -> str | None:
    problem = _acting_user(body)
    actions = body.get("actions")
    if problem is None and not actions:
        problem = "actions is missing or empty"
    for action in actions or ():
        if problem is None:
            problem = _fields(action, "actions[]", required=("action_id",), action_id=_string, block_id=_string,
                              value=_string, type=_string, action_ts=_string)
    container = body.get("container") or {}
    return problem or _fields(container, "container", channel_id=_id, message_ts=_ts, thread_ts=_ts, view_id=_string)


def _view_payload(body: dict[str, Any]) -> str | None:
    view = body.get("view")
    if not isinstance(view, dict):
        return "view is missing"
    problem = _acting_user(body) or _fields(view, "view", required=("callback_id",), callback_id=_string,
                                            private_metadata=_string, id=_string, type=_string, hash=_string,
                                            state=_object)
    if problem is not None:
        return problem
    values = (view.get("state") or {}).get("values")
    if values is None:
        return None
    if not isinstance(values, dict):
        return "view.state.values is not an object"
    for block in values.values():
        if not isinstance(block, dict) or not all(isinstance(element, dict) for element in block.values()):
            return "view.state.values is not blocks of elements"
        for element in block.values():
            text = element.get("value")
            if text is not None and not isinstance(text, str):
                return "an input's value is not a string"
    return None


def _block_suggestion(body: dict[str, Any]) -> str | None:
    return _acting_user(body) or _fields(body, "", required=("action_id", "value"), action_id=_string,
                                         block_id=_string, value=_string)


def _shortcut(body: dict[str, Any]) -> str | None:
    problem = _acting_user(body) or _fields(body, "", required=("callback_id",), callback_id=_string)
    message = body.get("message")
    return problem or (_fields(message, "message", ts=_ts, thread_ts=_ts) if isinstance(message, dict) else None)


def _command(body: dict[str, Any]) -> str | None:
    return _fields(body, "", required=("user_id", "channel_id", "team_id"), command=_string, text=_string,
                   user_id=_id, channel_id=_id, team_id=_id, trigger_id=_token)


_BY_TYPE: dict[str, Check] = {
    "event_callback": _event_callback, "block_actions": _block_actions, "view_submission": _view_payload,
    "view_closed": _view_payload, "block_suggestion": _block_suggestion, "shortcut": _shortcut,
    "message_action": _shortcut,
}


def _acting_user(body: dict[str, Any]) -> str | None:
    return None if user_id(body) else "user.id is missing or not a Slack id"


def _fields(item: dict[str, Any], where: str, *, required: tuple[str, ...] = (),
            **rules: Callable[[Any], bool]) -> str | None:
    prefix = f"{where}." if where else ""
    for name in required:
        if item.get(name) is None:
            return f"{prefix}{name} is missing"
    for name, rule in rules.items():
        if item.get(name) is not None and not rule(item[name]):
            return f"{prefix}{name} is not what Slack sends"
    return None


def _id(value: Any) -> bool:
    return is_id(value)


def _ts(value: Any) -> bool:
    return is_ts(value)


def _token(value: Any) -> bool:
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _object_with_id(value: Any) -> bool:
    return isinstance(value, dict) and (value.get("id") is None or is_id(value["id"]))


def _team(value: Any) -> bool:
    return is_id(value) or _object_with_id(value)
