"""Parsing cloudflared's stderr: URL, registration, rate limiting, metrics address."""

from __future__ import annotations

import pytest

from tunnel import find_tunnel_url, parse_stderr_line
from tunnel.parse import ready_url

BOX = (
    "2024-05-01T10:00:00Z INF |  https://brave-otter-fancy-lake.trycloudflare.com"
    "                                 |"
)


def test_url_from_the_banner_box() -> None:
    event = parse_stderr_line(BOX)
    assert event.url == "https://brave-otter-fancy-lake.trycloudflare.com"
    assert not event.registered and not event.rate_limited


@pytest.mark.parametrize(
    ("line", "url"),
    [
        ("INF https://a-1.trycloudflare.com/", "https://a-1.trycloudflare.com"),
        ("INF see https://x9.trycloudflare.com, ok", "https://x9.trycloudflare.com"),
        # Cloudflare's API host appears in error lines and is never a tunnel.
        ('ERR failed to request quick Tunnel: Post "https://api.trycloudflare.com/tunnel"', None),
        ("INF Requesting new quick Tunnel on trycloudflare.com...", None),
        ("INF http://plain.trycloudflare.com", None),
        ("INF https://evil.trycloudflare.com.attacker.net", None),
        ("INF https://UPPER.trycloudflare.com", None),
        ("INF https://x.trycloudflare.community", None),
        (
            "INF https://api.trycloudflare.com then https://real-one.trycloudflare.com",
            "https://real-one.trycloudflare.com",
        ),
    ],
)
def test_url_parse_is_strict(line: str, url: str | None) -> None:
    assert find_tunnel_url(line) == url


@pytest.mark.parametrize(
    "line",
    [
        'ERR Error unmarshaling QuickTunnel response: error code: 1015 status_code="429 Too Many Requests"',
        "ERR failed to unmarshal quick Tunnel: invalid character 'e'",
        "ERR 429 Too Many Requests https://api.trycloudflare.com/tunnel",
    ],
)
def test_rate_limit_markers(line: str) -> None:
    event = parse_stderr_line(line)
    assert event.rate_limited
    assert event.url is None


def test_registration_marker_and_not_its_opposite() -> None:
    assert parse_stderr_line(
        "INF Registered tunnel connection connIndex=0 connection=abc event=0 ip=1.2.3.4"
    ).registered
    assert not parse_stderr_line("WRN Unregistered tunnel connection connIndex=0").registered


def test_metrics_address() -> None:
    event = parse_stderr_line("INF Starting metrics server on 127.0.0.1:20241/metrics")
    assert event.metrics_address == "127.0.0.1:20241"
    assert ready_url("127.0.0.1:20241") == "http://127.0.0.1:20241/ready"
    assert ready_url("[::1]:5000") == "http://[::1]:5000/ready"
    assert ready_url("0.0.0.0:5000") is None
    assert ready_url("localhost:x") is None


def test_ordinary_lines_tell_nothing() -> None:
    event = parse_stderr_line("INF Version 2024.1.5")
    assert (event.url, event.registered, event.rate_limited, event.metrics_address) == (
        None,
        False,
        False,
        None,
    )
