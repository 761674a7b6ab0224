"""Outbound safety: where a webhook may go. Checked at send time (the address a name resolves
to now, not when the destination was saved), and the request is sent to exactly the address
checked, so a name that resolves elsewhere between the check and the send changes nothing:

- http or https only, no credentials in the URL;
- loopback, private, link-local, unspecified, multicast and reserved addresses refused, and
  the platform's own ports on this host, unless an admin allowed that destination explicitly
  (`trace destinations add --allow-private`);
- redirects are never followed (the sender's client does not follow them; a 3xx fails)."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_URL = 2048  # characters: a destination URL longer is refused (saved and at send)


class Refused(Exception):
    """A destination the Delivery Service will not send to; the message says why."""


@dataclass(frozen=True)
class Target:
    url: str  # the URL with its host replaced by the checked address
    host: str  # the name, for the Host header and TLS (SNI, certificate)
    address: str
    port: int
    scheme: str


def check_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL a destination may have, or Refused."""
    if len(url) > MAX_URL:
        raise Refused(f"the URL is longer than {MAX_URL} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused(f"only http and https destinations: {parts.scheme or 'no scheme'}")
    if parts.username or parts.password:
        raise Refused("no credentials in a destination URL (sign with its secret instead)")
    if not parts.hostname:
        raise Refused("the URL has no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise Refused(f"bad port: {e}") from None
    return parts.scheme, parts.hostname, port


def _why_internal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return _why_internal(ip.ipv4_mapped)
    for what, test in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if test:
            return what
    return None if ip.is_global else "not global"


def resolve(
    url: str, *, allow_private: bool, platform_ports: set[int] | frozenset[int] = frozenset()
) -> Target:
    """The address to send `url` to now, every address its name has checked; Refused
    otherwise."""
    scheme, host, port = check_url(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise Refused(f"{host} does not resolve: {e}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise Refused(f"{host} has no address")
    if not allow_private:
        for a in addresses:
            ip = ipaddress.ip_address(a.split("%")[0])
            why = _why_internal(ip)
            if why is not None:
                raise Refused(
                    f"{host} resolves to {a}, a {why} address: refused unless an admin allows "
                    "this destination (trace destinations add --allow-private)"
                )
            if port in platform_ports and a in _own_addresses():
                raise Refused(f"{host}:{port} is one of the platform's own ports")
    address = addresses[0]
    shown = f"[{address}]" if ":" in address else address
    parts = urlsplit(url)
    netloc = f"{shown}:{port}"
    return Target(
        url=parts._replace(netloc=netloc).geturl(),
        host=host,
        address=address,
        port=port,
        scheme=scheme,
    )


def _own_addresses() -> set[str]:
    try:
        return set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        return set()
