"""``http_request``: one HTTP call with a timeout and a size cap; redirects to other hosts are reported."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp

from core.tools import Risk, Tool, ToolContext, ToolError

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]
MAX_REDIRECTS = 5
# Resolves a credential name to the headers it adds (e.g. Authorization), for this call only.
CredentialHeaders = Callable[[ToolContext, str], Awaitable[dict[str, str]]]


def http_request_tool(*, timeout_s: float = 30, max_bytes: int = 1_000_000,
                      credential_headers: CredentialHeaders | None = None) -> Tool:

    async def http_request(ctx: ToolContext, args: dict[str, Any]) -> str:
        method = str(args["method"]).upper()
        url = str(args["url"])
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ToolError("url must be an absolute http:// or https:// URL")
        headers = {str(k): str(v) for k, v in (args.get("headers") or {}).items()}
        if args.get("credential"):
            if credential_headers is None:
                raise ToolError(f"credential {args['credential']!r} is not available: no credential store here")
            headers.update(await credential_headers(ctx, str(args["credential"])))
        body = args.get("body")
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        notes: list[str] = []
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for _hop in range(MAX_REDIRECTS + 1):
                try:
                    async with http.request(method, url, headers=headers, data=body, allow_redirects=False) as resp:
                        location = resp.headers.get("Location")
                        if resp.status in (301, 302, 303, 307, 308) and location:
                            target = urljoin(url, location)
                            if urlsplit(target).netloc != urlsplit(url).netloc:
                                notes.append(f"redirected to another host, not followed: {target}")
                                return _render(resp.status, resp.headers, b"", 0, notes)
                            notes.append(f"followed redirect to {target}")
                            if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                                method, body = "GET", None
                            url = target
                            continue
                        raw = await resp.content.read(max_bytes + 1)
                        return _render(resp.status, resp.headers, raw[:max_bytes], len(raw), notes)
                except TimeoutError:
                    raise ToolError(f"{method} {url} timed out after {timeout_s:g} s") from None
                except aiohttp.ClientError as exc:
                    raise ToolError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from None
        raise ToolError(f"more than {MAX_REDIRECTS} redirects")

    return Tool(
        name="http_request",
        description="Make one HTTP request and return the status, main headers and body. A person must approve it.",
        parameters={
            "type": "object",
            "properties": {
                "method": {"type": "string", "enum": METHODS},
                "url": {"type": "string", "description": "absolute http(s) URL"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "body": {"type": "string"},
                "credential": {"type": "string", "description": "name of a stored credential to authenticate with"},
            },
            "required": ["method", "url"],
            "additionalProperties": False,
        },
        risk=Risk.GATED,
        function=http_request,
        timeout_s=timeout_s * (MAX_REDIRECTS + 1) + 5,
        pattern_arg="url",
    )


def _render(status: int, headers: Any, body: bytes, total: int, notes: list[str]) -> str:
    lines = [f"HTTP {status}"]
    for name in ("Content-Type", "Content-Length", "Location"):
        if name in headers:
            lines.append(f"{name}: {headers[name]}")
    lines += [f"({note})" for note in notes]
    text = body.decode("utf-8", errors="replace")
    if total > len(body):
        text += f"\n[body truncated at {len(body)} bytes]"
    return "\n".join(lines) + ("\n\n" + text if text else "")
