"""Host names as people write them for a credential ("api.github.com", "*.example.com") and as a
URL names them: one normal form, one matching rule.

A wildcard may not cover names anyone can register: ``*.github.io`` or ``*.co.uk`` would send the
credential to whoever registers ``evil.github.io``. The Public Suffix List shipped inside the
``publicsuffixlist`` package (nothing is fetched at run time) says which those are; it is as recent as
the installed package.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable

from publicsuffixlist import PSLFILE, PublicSuffixList, encode_idn

MAX_HOSTS = 32
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"^(?:{_LABEL}\.)*{_LABEL}$")
_HOSTS_HELP = ("give host names or IP addresses only, without a scheme, path or port "
               "(e.g. api.github.com, *.example.com, 203.0.113.7)")


def normalize_host(host: str) -> str:
    """Lower case, no brackets, no trailing dot; an IP address in its canonical form."""
    host = host.strip().lower().strip("[]").rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    """Exact host (any case, no final dot); ``*.example.com`` matches any name below example.com."""
    host = normalize_host(host)
    for pattern in (normalize_host(h) for h in allowed):
        if host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


def parse_hosts(raw: object, *, secret: str | None = None) -> tuple[list[str] | None, str | None]:
    """Where a credential may be sent: ``(hosts, None)``, ``(None, None)`` for anywhere, or
    ``(None, why)``. Takes comma-separated text or a list of such; host names (``*.`` allowed in
    front of a domain) or IP literals, normalised to lower case without brackets or a final dot.

    Hosts are stored as plain text, so what was pasted there by mistake (the value itself, or any token)
    must be refused, never kept: ``secret`` is the value being stored, and a name must look like one
    (a dotted name ending in a word, ``localhost``, or an IP address). A refusal never quotes the entry."""
    if raw is None:
        return None, None
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list | tuple) or not all(isinstance(item, str) for item in raw):
        return None, "Allowed hosts must be text: host names separated by commas."
    bare = (secret or "").strip()
    if len(bare) >= 4 and any(bare in item or (len(item.strip()) >= 4 and item.strip() in bare) for item in raw):
        return None, "Allowed hosts holds the secret value itself: put the value in its own field, and host names here."
    hosts: list[str] = []
    for position, entry in enumerate((e.strip() for item in raw for e in item.split(",")), start=1):
        if not entry:
            continue
        host, problem = _one_host(entry, position)
        if problem is not None:
            return None, problem
        assert host is not None
        if host not in hosts:
            hosts.append(host)
        if len(hosts) > MAX_HOSTS:
            return None, f"Allowed hosts: at most {MAX_HOSTS}."
    return hosts or None, None


def _one_host(entry: str, position: int = 1) -> tuple[str | None, str | None]:
    if len(entry) > 253:
        return None, "Allowed hosts: an entry is too long to be a host name."
    # Named by its place, never quoted: what was typed there may be a secret pasted into the wrong field.
    shown = f"entry {position}"
    bad = f"Allowed hosts: {shown} is not a host: {_HOSTS_HELP}."
    if not entry.isascii():
        return None, f"Allowed hosts: {shown}: write the name in its ASCII form (xn--...)."
    host = entry.lower()
    if ":" in host:  # only an IPv6 literal may hold a colon (a port or a scheme is refused)
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            return str(ipaddress.IPv6Address(inner)), None
        except ValueError:
            return None, bad
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    name = name[:-1] if name.endswith(".") else name
    if not _HOST_NAME.match(name):
        return None, bad
    labels = name.split(".")
    if labels[-1].isdigit() or labels[-1].startswith("0x"):  # shaped like an IPv4 address: it must be one
        if wildcard:
            return None, bad
        try:
            return str(ipaddress.IPv4Address(name)), None
        except ValueError:
            return None, f"Allowed hosts: {shown} is not a valid IP address."
    if wildcard and len(labels) < 2:
        return None, f"Allowed hosts: {shown} covers a whole top-level domain; name a domain (*.example.com)."
    if len(labels) < 2 and name != "localhost":  # "sk-live-…", "xoxb-…", a hex token: shaped like one label
        return None, (f"Allowed hosts: {shown} is a single word, not a host name: write the full name "
                      "such as api.corp.example).")
    top = labels[-1]
    if not (top.isalpha() or top.startswith("xn--")):  # top-level domains are words: "eyJ0.c2lnbmF0dXJlMQ"
        return None, bad
    if wildcard and _public_under(name):
        return None, (f"Allowed hosts: {shown} covers names anyone can register (it is or holds a public "
                      "suffix such as co.uk or github.io); list the exact hosts, or a wildcard below a domain "
                      "you own (*.yours.github.io).")
    return ("*." if wildcard else "") + name, None


def _public_under(domain: str) -> bool:
    """Whether ``domain`` is a public suffix or has one below it (``amazonaws.com`` holds ``s3.amazonaws.com``)."""
    psl, holders = _suffix_list()
    return psl.is_public(domain) or domain in holders


@functools.cache
def _suffix_list() -> tuple[PublicSuffixList, frozenset[str]]:
    """The list, and every domain that has a public suffix strictly below it."""
    holders: set[str] = set()
    with open(PSLFILE, encoding="utf-8") as source:
        for line in source:
            rule = line.strip().split(" ", 1)[0].lower()
            if not rule or rule.startswith(("//", "!")):  # comments; "!" marks an exception (registrable)
                continue
            try:
                labels = encode_idn(rule.removeprefix("*.")).split(".")
            except UnicodeError:
                labels = rule.removeprefix("*.").split(".")
            holders.update(".".join(labels[i:]) for i in range(1, len(labels)))
    return PublicSuffixList(), frozenset(holders)


def default_hosts(host: str) -> list[str]:
    """Where a token from ``host``'s authorization server may go by default: its registrable domain and the
    names below it (``github.com``, ``*.github.com``), or the host alone when that would reach names others
    can register (``*.herokuapp.com``), for an IP address or a one-label name."""
    host = normalize_host(host)
    if "." not in host or ":" in host or host.replace(".", "").isdigit():
        return [host]
    psl, _holders = _suffix_list()
    domain = psl.privatesuffix(host)
    if not domain or _public_under(domain):
        return [host]
    return [domain, f"*.{domain}"]
