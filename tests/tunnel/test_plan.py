"""Flag validation (one-line errors before anything starts) and the tunnel decision from /health."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tunnel import (
    INSECURE_ADVERTISE_URL,
    TunnelConfigError,
    TunnelPlan,
    choose_tunnel,
    validate_tunnel_flags,
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_flags_means_auto_detection() -> None:
    plan = validate_tunnel_flags(None, None, None)
    assert plan == TunnelPlan()
    assert plan.auto_detect
    assert plan.resume_flags() == []


@pytest.mark.parametrize(
    ("tunnel", "url", "port", "message"),
    [
        ("ngrok", None, None, "--tunnel supports only 'cloudflared', got 'ngrok'"),
        ("Cloudflared", None, None, "--tunnel supports only 'cloudflared', got 'Cloudflared'"),
        (
            "cloudflared",
            "https://x.example",
            8080,
            "--tunnel and --advertise-url are mutually exclusive: --tunnel manages a tunnel for "
            "you, --advertise-url points at one you run.",
        ),
        (None, None, 0, "--listener-port must be between 1 and 65535, got 0"),
        (None, None, 65536, "--listener-port must be between 1 and 65535, got 65536"),
        (
            None,
            "https://x.example",
            None,
            "--advertise-url requires --listener-port: your tunnel needs a fixed local port to "
            "forward to.",
        ),
    ],
)
def test_bad_flags_give_the_reference_messages(
    tunnel: str | None, url: str | None, port: int | None, message: str
) -> None:
    with pytest.raises(TunnelConfigError) as info:
        validate_tunnel_flags(tunnel, url, port)
    assert str(info.value) == message


def test_unknown_provider_is_reported_before_the_url_shape() -> None:
    with pytest.raises(TunnelConfigError, match="supports only"):
        validate_tunnel_flags("frp", "ftp://bad", 0)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host.example",
        "host.example",
        "https://",
        "https:///path",
        "https://host.example/?x=1",
        "https://host.example/#frag",
        "https://host.example/path?",
        "https://host.example:notaport",
        "https://host.example:99999",
        "https://host .example",
        "",
    ],
)
def test_malformed_advertise_url_is_rejected(url: str) -> None:
    with pytest.raises(TunnelConfigError) as info:
        validate_tunnel_flags(None, url, _free_port())
    assert str(info.value) == (
        "--advertise-url must be an http(s) base URL with a host and no query or fragment, "
        f"got '{url}'"
    )
    assert "\n" not in str(info.value)


def test_url_shape_is_checked_before_the_missing_port() -> None:
    with pytest.raises(TunnelConfigError, match="must be an http"):
        validate_tunnel_flags(None, "ftp://x", None)


def test_advertise_url_with_path_prefix_is_accepted() -> None:
    port = _free_port()
    plan = validate_tunnel_flags(None, "https://tunnel.example/prefix/", port)
    assert plan.advertise_url == "https://tunnel.example/prefix/"
    assert plan.listener_port == port
    assert not plan.auto_detect
    assert plan.warnings == ()
    assert plan.resume_flags() == [
        "--advertise-url",
        "https://tunnel.example/prefix/",
        "--listener-port",
        str(port),
    ]


def test_plain_http_off_this_machine_warns() -> None:
    plan = validate_tunnel_flags(None, "http://10.0.0.5:9000", _free_port())
    assert [w.code for w in plan.warnings] == [INSECURE_ADVERTISE_URL]
    assert plan.warnings[0].message == (
        "--advertise-url uses plain http: the per-run bridge bearer and all model traffic cross "
        "the network unencrypted."
    )


@pytest.mark.parametrize("url", ["http://localhost:9000", "http://127.0.0.1:9000/x"])
def test_plain_http_on_loopback_does_not_warn(url: str) -> None:
    assert validate_tunnel_flags(None, url, _free_port()).warnings == ()


def test_listener_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(TunnelConfigError) as info:
            validate_tunnel_flags(None, "https://t.example", port)
    message = str(info.value)
    assert message.startswith(f"could not bind the LLM bridge on 127.0.0.1:{port}: ")
    assert "--listener-port" in message
    assert "\n" not in message


def test_port_probe_releases_the_port() -> None:
    port = _free_port()
    validate_tunnel_flags(None, None, port)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_forced_tunnel_plan() -> None:
    plan = validate_tunnel_flags("cloudflared", None, None)
    assert plan.forced == "cloudflared"
    assert plan.resume_flags() == ["--tunnel", "cloudflared"]


# What the health report of a sandbox backend and of a LocalBackend yields (the parsing of the
# body itself is tested with HealthReport in tests/rollout_server/test_health_report.py).
HARBOR_DOCKER: dict[str, Any] = {"requires_public_url": True, "environment": " docker "}
LOCAL: dict[str, Any] = {"requires_public_url": False, "environment": None}


@pytest.mark.parametrize(
    ("requires_public_url", "environment", "label"),
    [
        (True, " docker ", "docker"),
        (True, None, "remote"),
        (True, "   ", "remote"),
        (True, "", "remote"),
        (False, "docker", None),
        (None, "daytona", None),
        (None, None, None),
    ],
)
def test_health_capability_detection(
    requires_public_url: bool | None, environment: str | None, label: str | None
) -> None:
    decision = choose_tunnel(
        TunnelPlan(), requires_public_url=requires_public_url, environment=environment
    )
    assert decision.environment == label
    assert decision.mode == ("none" if label is None else "managed")


def test_auto_tunnel_from_health() -> None:
    decision = choose_tunnel(TunnelPlan(), **HARBOR_DOCKER)
    assert decision.mode == "managed"
    assert decision.environment == "docker"
    assert decision.keepalive
    assert decision.milestone == "detected docker sandbox; enabling cloudflared automatically"


def test_no_tunnel_for_local_backend() -> None:
    decision = choose_tunnel(TunnelPlan(), **LOCAL)
    assert decision.mode == "none"
    assert not decision.keepalive
    assert decision.milestone is None


def test_forced_tunnel_ignores_health() -> None:
    decision = choose_tunnel(TunnelPlan(forced="cloudflared"), **LOCAL)
    assert decision.mode == "managed"
    assert decision.environment is None
    assert decision.milestone is None
    assert decision.keepalive


def test_advertise_url_disables_auto_detection() -> None:
    plan = TunnelPlan(advertise_url="https://mine.example", listener_port=9000)
    decision = choose_tunnel(plan, **HARBOR_DOCKER)
    assert decision.mode == "advertise"
    assert decision.advertise_url == "https://mine.example"
    assert decision.keepalive
    assert decision.milestone == "advertising chat endpoint through https://mine.example"
