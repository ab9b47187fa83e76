"""Files shared with a message: fetched with the bot token from Slack's own file host only."""

from __future__ import annotations

import aiohttp
import yarl
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.workspaces import bot_token
from core.errors import FetchFailed, FileTooBig

FILE_HOSTS = frozenset({"files.slack.com"})  # where shared files live (url_private_download)
_FILE_TIMEOUT = aiohttp.ClientTimeout(total=30.0)


async def fetch_shared_file(client: AsyncWebClient, source: str, max_bytes: int, hosts: frozenset[str]) -> bytes:
    """A shared file's bytes, fetched with the bot token (``files:read``) from Slack's own file host only:
    the token never goes anywhere else, also not through a redirect. Raises FetchFailed (FileTooBig past
    ``max_bytes``: no more than that is ever read) with the reason."""
    if not source:
        raise FetchFailed("Slack did not share its content with the bot")
    url = source
    for _hop in range(3):
        if not _file_url_ok(url, hosts):
            raise FetchFailed("it is not on Slack's file host")
        session = client.session
        if session is None:
            raise FetchFailed("the bot is not connected to Slack right now")
        try:
            token = await bot_token(client)
        except SlackApiError as exc:  # no workspace in scope, or no longer installed there
            raise FetchFailed(str(exc).splitlines()[0]) from None
        try:
            # identity: the size limit counts what arrives, and nothing is inflated past it.
            headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}
            async with session.get(url, headers=headers, allow_redirects=False, timeout=_FILE_TIMEOUT) as resp:
                if resp.status in (301, 302, 303, 307, 308):
                    url = _redirect(resp)
                    continue
                if resp.status != 200:
                    raise FetchFailed(f"Slack answered HTTP {resp.status}")
                if resp.content_type == "text/html":  # Slack's sign-in page: the app lacks files:read
                    raise FetchFailed("Slack did not hand it over (the app may lack the files:read scope)")
                if resp.content_length is not None and resp.content_length > max_bytes:
                    raise FileTooBig(max_bytes)
                content = bytearray()
                async for piece in resp.content.iter_chunked(65_536):
                    content += piece
                    if len(content) > max_bytes:
                        raise FileTooBig(max_bytes)
                return bytes(content)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise FetchFailed(f"Slack could not be reached ({type(exc).__name__})") from None
    raise FetchFailed("Slack redirected too often")


def _redirect(resp: aiohttp.ClientResponse) -> str:
    """Where a redirect points (checked like the first URL before anything is sent there)."""
    location = resp.headers.get("Location")
    try:
        if not location:
            raise ValueError("no Location")
        return str(resp.url.join(yarl.URL(location)))
    except ValueError:
        raise FetchFailed("Slack redirected it nowhere usable") from None


def _file_url_ok(url: str, hosts: frozenset[str]) -> bool:
    """Whether the bot token may go to ``url``: https on one of Slack's file hosts (or exactly the configured
    API host, for a test Slack or a proxy in front of it)."""
    try:
        parsed = yarl.URL(url)
    except ValueError:
        return False
    if parsed.user or parsed.password or not parsed.host:
        return False
    authority = f"{parsed.host}:{parsed.explicit_port}" if parsed.explicit_port else parsed.host
    if parsed.path.startswith("/api/"):  # the Web API itself (a configured host serves both): never a file
        return False
    if parsed.scheme == "https" and parsed.host in hosts and parsed.explicit_port in (None, 443):
        # Slack's file host serves shared files under /files-pri/ only.
        return parsed.host != "files.slack.com" or parsed.path.startswith("/files-pri/")
    return authority in hosts and parsed.scheme in ("http", "https") and ":" in authority
