"""Unit tests of the egress policy: addresses, allow-lists, connect-time checks."""

from __future__ import annotations

import pytest

from aiworker.activities.errors import EgressDeniedError
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.fetch import FetchTool


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://172.16.5.4/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://0.0.0.0/",
        "http://metadata.google.internal/",
        "file:///etc/passwd",
    ],
)
def test_egress_denies_non_public_targets(url: str) -> None:
    with pytest.raises(EgressDeniedError):
        EgressPolicy().check_url(url)


def test_egress_allow_lists_private_switch_and_trusted_endpoints() -> None:
    EgressPolicy().check_url("http://93.184.215.14/")
    open_private = EgressPolicy(allow_private_networks=True)
    open_private.check_url("http://10.1.2.3/")
    with pytest.raises(EgressDeniedError):  # metadata stays denied even then
        open_private.check_url("http://169.254.169.254/")
    listed = EgressPolicy(allow_domains=["example.com"])
    listed.check_url("https://www.example.com/x")
    for bad in ("https://example.org/", "https://notexample.com/", "http://93.184.215.14/"):
        with pytest.raises(EgressDeniedError):
            listed.check_url(bad)
    with pytest.raises(EgressDeniedError):  # a request can narrow the list, not widen it
        listed.check_url("https://www.example.com/", ["shop.example.com"])
    trusted = EgressPolicy(trusted_endpoints=[("127.0.0.1", 8080)])
    trusted.check_address("127.0.0.1", 8080)
    with pytest.raises(EgressDeniedError):
        trusted.check_address("127.0.0.1", 8081)


async def test_resolved_private_address_is_denied_at_connect() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["93.184.215.14", "10.0.0.5"]  # one bad answer taints the host

    fetcher = FetchTool(EgressPolicy(resolver=resolver))
    try:
        with pytest.raises(EgressDeniedError) as e:
            await fetcher.fetch("http://rebind.example/", timeout=5, respect_robots=False)
        assert e.value.context["address"] == "10.0.0.5"
    finally:
        await fetcher.aclose()
