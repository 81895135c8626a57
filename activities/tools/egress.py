"""The egress policy: which hosts and addresses a fetch may reach.

Checked twice for every hop of a fetch, redirects included:

1. before the request, on the URL: scheme, the domain allow-lists (from
   settings, narrowed by the call's tenant and per request: a host must be
   in every list that is set, so the tighter wins) and IP literals;
2. at connect time, inside the HTTP client
   (:mod:`~aiworker.activities.tools.http_client`: aiohttp's resolver hook and
   its socket factory), on every address the host resolves to and every
   address dialled. The connection goes to the vetted address itself, so a
   DNS answer that changes between check and connect (DNS rebinding) cannot
   slip through.

The tenant's list (the registry's ``egress_allow``) reaches the policy through
a context variable that the worker runtime sets around each call
(:func:`tenant_egress`): the tools are shared by every call of a process, and
a worker that forgets to pass it on must not widen its tenant's egress.

Loopback, private, link-local, CGNAT (100.64/10), multicast, reserved and
unspecified addresses are denied unless ``allow_private_networks`` is set;
cloud metadata endpoints and multicast are denied even then. Tests that need
a loopback server while proving denial name that exact ``(address, port)`` in
``trusted_endpoints`` instead of opening all private networks.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aiworker.activities.errors import EgressDeniedError

_Stream = TypeVar("_Stream")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

# Cloud metadata services (AWS/GCP/Azure/OpenStack, AWS IPv6, Alibaba, Oracle).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class ResolveError(OSError):
    """A host name that does not resolve, or resolves to no address (an ``OSError``,
    as the system resolver's own: HTTP clients report it as a connect failure)."""


# The current call's tenant allow-list; empty: the tenant adds no list.
_TENANT_DOMAINS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "aiworker_tenant_egress", default=()
)


@contextlib.contextmanager
def tenant_egress(domains: Iterable[str] | None) -> Iterator[None]:
    """Hold every egress check in this context (and the tasks it starts) to
    ``domains`` as well, the call's tenant allow-list; None or empty: no list."""
    token = _TENANT_DOMAINS.set(tuple(d.lower().lstrip(".") for d in domains or ()))
    try:
        yield
    finally:
        _TENANT_DOMAINS.reset(token)


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (all address families)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    out: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in out:
            out.append(addr)
    return out


_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


def _literal(host: str) -> IPAddress | None:
    h = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    # Spellings the C resolver still reads as IPv4 (0177.0.0.1, 2130706433, 0x7f.1,
    # 127.1): treat them as the address they mean, never as a host name.
    if _LEGACY_IPV4.match(h):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(h))
        except OSError:
            return None
    return None


def address_problem(ip: IPAddress, allow_private: bool) -> str | None:
    """Why ``ip`` may not be reached, or ``None`` if it may."""
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            return address_problem(mapped, allow_private)
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_multicast:
        return "a multicast address"
    if allow_private:
        return None
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a carrier-grade NAT (100.64/10) address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global:
        return "a reserved or non-global address"
    return None


def _domain_match(host: str, domains: Iterable[str]) -> bool:
    return any(host == d or host.endswith("." + d) for d in domains)


class EgressPolicy:
    """Decides which URLs and addresses a fetch may reach.

    Args:
        allow_private_networks: allow loopback, private, link-local and CGNAT
            addresses (development and tests only).
        allow_domains: if not empty, only these domains and their subdomains.
        trusted_endpoints: exact ``(address, port)`` pairs allowed regardless,
            so a test can reach its loopback server with private networks off.
        resolver: ``async (host, port) -> [address]``; the system resolver by
            default, replaceable so tests can map names to loopback servers.
    """

    def __init__(
        self,
        *,
        allow_private_networks: bool = False,
        allow_domains: Iterable[str] = (),
        trusted_endpoints: Iterable[tuple[str, int]] = (),
        resolver: Resolver | None = None,
    ) -> None:
        self.allow_private_networks = allow_private_networks
        self.allow_domains = tuple(d.lower().lstrip(".") for d in allow_domains)
        self.trusted_endpoints = frozenset(
            (str(ipaddress.ip_address(a)), int(p)) for a, p in trusted_endpoints
        )
        self.resolver: Resolver = resolver or system_resolver

    @classmethod
    def from_settings(cls, settings: Any, **kw: Any) -> EgressPolicy:
        """The policy that ``settings`` configure; ``kw`` adds test hooks."""
        return cls(
            allow_private_networks=settings.allow_private_networks,
            allow_domains=settings.egress_allow,
            **kw,
        )

    def check_url(self, url: str, allow_domains: Iterable[str] | None = None) -> None:
        """Check a URL before any request; ``allow_domains`` narrows the settings' list."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise EgressDeniedError(
                f"scheme {parts.scheme!r} is not allowed (http and https only)", url=url
            )
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            raise EgressDeniedError("URL has no host", url=url)
        narrowed = tuple(d.lower().lstrip(".") for d in allow_domains or ())
        ip = _literal(host)
        if ip is None:
            if host in METADATA_HOSTS:
                raise EgressDeniedError(f"{host} is a cloud metadata host", url=url, host=host)
            tenant = _TENANT_DOMAINS.get()
            for lst, what in (
                (self.allow_domains, "settings"),
                (tenant, "tenant"),
                (narrowed, "request"),
            ):
                if lst and not _domain_match(host, lst):
                    raise EgressDeniedError(
                        f"host {host} is not in the {what} egress allow-list", url=url, host=host
                    )
            return
        if self.allow_domains or narrowed or _TENANT_DOMAINS.get():
            raise EgressDeniedError(
                f"address {ip} is not allowed: the egress allow-list names domains",
                url=url,
                address=str(ip),
            )
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.check_address(str(ip), port, url=url)

    def check_address(self, address: str, port: int, *, url: str | None = None) -> None:
        """Deny connecting to ``address:port``; ``EgressDeniedError`` says why."""
        ip = _literal(address)
        if ip is None:
            raise EgressDeniedError(f"{address!r} is not an IP address", url=url, address=address)
        if (str(ip), port) in self.trusted_endpoints:
            return
        problem = address_problem(ip, self.allow_private_networks)
        if problem is not None:
            raise EgressDeniedError(
                f"egress to {ip} denied: {problem}", url=url, address=str(ip), port=port
            )

    async def resolve(self, host: str, port: int) -> list[str]:
        """Every address of ``host``, all of which must pass; the vetted list."""
        if _literal(host) is not None:
            addrs = [host.strip("[]")]
        else:
            try:
                addrs = await self.resolver(host, port)
            except OSError as e:
                raise ResolveError(f"cannot resolve {host}: {e}") from e
        if not addrs:
            raise ResolveError(f"{host} has no addresses")
        for a in addrs:
            self.check_address(a, port, url=f"//{host}:{port}")
        return addrs


async def connect_first(
    addrs: list[str],
    connect: Callable[[str], Awaitable[_Stream]],
    refused: type[Exception],
) -> _Stream:
    """The first of the vetted ``addrs`` that takes a connection; the last ``refused``
    error when none does: httpcore2's backend for MCP servers (the fetch tool's
    aiohttp connector dials the vetted addresses in order itself)."""
    last: Exception | None = None
    for addr in addrs:
        try:
            return await connect(addr)
        except refused as e:
            last = e
    raise last or refused("no address to connect to")
