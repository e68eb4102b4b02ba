"""Address rules: legacy IPv4 spellings read as the resolver reads them; what counts as public."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from sglang_omni.media.addresses import is_local_name, is_public, legacy_ipv4, literal_ip


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0X7F.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("10.0x10.0377.1", "10.16.255.1"),
        ("127.0.0.1.", "127.0.0.1"),
    ],
)
def test_legacy_ipv4_spellings(host: str, address: str) -> None:
    assert legacy_ipv4(host) == ipaddress.IPv4Address(address)
    # the same answer the C library gives (what getaddrinfo would connect to)
    assert socket.inet_ntoa(socket.inet_aton(host.rstrip("."))) == address


@pytest.mark.parametrize(
    "host",
    ["example.com", "256.0.0.1", "1.2.3.4.5", "08.0.0.1", "0x1g.0.0.1", "1..2", "", ".",
     "1.2.3.256", "1.16777216", "0x", "4294967296", "a1.2.3.4", "1.2.3.4a"],
)
def test_not_ipv4_literals(host: str) -> None:
    assert legacy_ipv4(host) is None


def test_literal_ip_reads_ipv6() -> None:
    assert literal_ip("[::1]") == ipaddress.IPv6Address("::1")
    assert literal_ip("::ffff:7f00:1") == ipaddress.IPv6Address("::ffff:127.0.0.1")
    assert literal_ip("example.com") is None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.216.34",
                                     "2001:4860:4860::8888", "2002:808:808::"])
def test_public_addresses(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "::1", "::ffff:8.8.8.8",
                                     "fe80::1%eth0", "64:ff9b::a00:1", "2001::1", "224.1.1.1"])
def test_non_public_addresses(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


def test_local_names() -> None:
    assert all(map(is_local_name, ["localhost", "LOCALHOST.", "a.b.localhost", "ip6-localhost"]))
    assert not any(map(is_local_name, ["localhost.example.com", "mylocalhost", "example.com"]))
