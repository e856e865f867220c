"""Where a tenant's webhook may point, and how a delivery reaches it.

A tenant chooses its ``webhook_url``, and the worker POSTs to it from inside the deployment:
pointed at loopback, a private network or a cloud metadata address, the worker would reach
what the tenant cannot, and a failure's detail (status, refused connection) would tell it what
answers there. So such targets are refused (unless the operator allows them), once when the
URL is set and again at every delivery against the addresses the name resolves to then, and
the request goes to the address checked (a name that resolves elsewhere a moment later, DNS
rebinding, changes nothing). A failed delivery is recorded without the target's answer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx

from service.errors import Invalid

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


# The bytes of a webhook's answer read at most.
ANSWER_LIMIT = 64 * 1024


class Refused(Exception):
    """The webhook's target is not one the worker may reach."""


# IPv6 forms that carry an IPv4 address: a packet to one reaches that IPv4 address (through
# a tunnel, a translator or the host's own IPv4 stack), so each counts as what it carries.
# IPv4-mapped (::ffff:0:0/96), IPv4-translated (::ffff:0:0:0/96), IPv4-compatible (::/96) and
# NAT64's well-known prefix (64:ff9b::/96) end with it; 6to4 (2002::/16) has it after the
# prefix, and Teredo (2001::/32) both its server's and, inverted, its client's.
MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
COMPATIBLE = ipaddress.IPv6Network("::/96")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# NAT64's local-use prefix: the network chooses how much of it is its prefix (48, 56, 64 or
# 96 bits, with bits 64 to 71 left zero), and so where the IPv4 address sits: the address
# counts as every IPv4 address a gateway might read in it.
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
NAT64_LENGTHS = (48, 56, 64, 96)


def _nat64_reading(value: int, length: int) -> ipaddress.IPv4Address:
    """The IPv4 address an RFC 6052 address with a ``length``-bit prefix carries: the 32 bits
    after the prefix, bits 64 to 71 left out."""
    without_u = (value >> 64) << 56 | (value & (1 << 56) - 1)  # 120 bits
    start = length if length <= 64 else length - 8
    return ipaddress.IPv4Address(without_u >> (120 - start - 32) & 0xFFFFFFFF)


def carried(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, and so reaches (none for a plain one)."""
    last = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in MAPPED or address in TRANSLATED or address in COMPATIBLE or address in NAT64:
        return [last]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    if address in NAT64_LOCAL:
        return [_nat64_reading(int(address), length) for length in NAT64_LENGTHS]
    return []


def public(address: IPAddress) -> bool:
    """Whether an address is on the public internet (not loopback, link-local, site-local,
    private, multicast, unspecified or reserved); an IPv6 address carrying IPv4 ones (mapped,
    translated, compatible, 6to4, Teredo, NAT64) counts as those, all of them public."""
    if isinstance(address, ipaddress.IPv6Address):
        inside = carried(address)
        if inside:
            return all(public(v4) for v4 in inside)
        if address.is_site_local:
            return False
    return address.is_global and not address.is_multicast


def _target(url: str) -> tuple[SplitResult, str, int]:
    """The URL's parts, host name and port (the scheme's when none is written);
    ``ValueError`` for a URL that is not http(s) or whose host or port cannot be read (a port
    out of range or not a number, an unclosed IPv6 bracket, a name with a label over 63
    characters: every delivery would fail)."""
    parts = urlsplit(url)
    port = parts.port
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError("not an http(s) URL")
    host.encode("idna")  # UnicodeError, a ValueError, for a name DNS cannot carry
    return parts, host, port or (443 if parts.scheme == "https" else 80)


def check_url(url: str, *, allow_private: bool) -> None:
    """``Invalid`` for a webhook URL that is not http(s) or names a non-public address."""
    try:
        _, host, _ = _target(url)
    except ValueError:
        raise Invalid(
            "an http(s) URL, or empty to switch it off", field="settings.webhook_url"
        ) from None
    if allow_private:
        return
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        raise Invalid("the webhook must be on the public internet", field="settings.webhook_url")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return  # a name: checked against what it resolves to at each delivery
    if not public(literal):
        raise Invalid("the webhook must be on the public internet", field="settings.webhook_url")


async def _resolve(host: str, port: int) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise Refused("the webhook's host name does not resolve") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


async def post(
    url: str, body: dict[str, Any], *, timeout: float, allow_private: bool
) -> httpx.Response:
    """POST ``body`` to ``url`` at an address checked just before (``Refused`` if none may be
    reached), within ``timeout`` seconds in all (``TimeoutError``), reading at most
    ``ANSWER_LIMIT`` bytes of the answer; TLS is still verified for the URL's host name."""
    try:
        parts, host, port = _target(url)
    except ValueError:
        # Kept from before such URLs were refused when set: no delivery would get further.
        raise Refused("the webhook URL is not an http(s) URL that can be reached") from None
    addresses = await _resolve(host, port)
    allowed = [a for a in addresses if allow_private or public(a)]
    if not allowed or len(allowed) < len(addresses):
        raise Refused("the webhook's address is not on the public internet")
    address = allowed[0]
    shown = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{shown}:{parts.port}" if parts.port else shown
    pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    # A name in another script as DNS and TLS have it (a Host header is ASCII).
    name = host.encode("idna").decode("ascii")
    authority = f"[{name}]" if ":" in name else name
    if parts.port:
        authority = f"{authority}:{parts.port}"
    headers = {"User-Agent": "memoria", "Host": authority}
    # The client's timeout bounds each read, not the answer: a target that sends a byte now
    # and then would hold the delivery job, and a worker slot, for as long as it dripped.
    async with (
        asyncio.timeout(timeout),
        httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
        client.stream(
            "POST", pinned, json=body, headers=headers, extensions={"sni_hostname": name}
        ) as response,
    ):
        # The status is the answer; its body is read only so far (raw: a compressed one is
        # not inflated), or an answer without end would fill the worker's memory.
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read >= ANSWER_LIMIT:
                break
        return response
