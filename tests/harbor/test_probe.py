"""The probe ladder from inside real podman sandboxes (rollout_server/harbor/probe.py), against
a real bridge on 127.0.0.1, port 0. The pure parts (output parsing, classification, ladder)
are checked without podman."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest
import trio

from bridge import BridgeConfig, BridgeHandle, run_bridge
from launcher.sandbox_probe import describe_failure
from rollout_server.harbor.containers import owner_token
from rollout_server.harbor.probe import (
    PROBE_LABEL,
    classify,
    decide_route,
    ladder,
    parse_probe_output,
    relay_module_path,
)
from rollout_server.harbor.route import SLIRP_NETWORK_MODE, Candidate, ProbeReport

from .conftest import IMAGE

NONCE = "0123456789abcdef" * 2


def probe_containers() -> list[str]:
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={PROBE_LABEL}=1", "--format", "{{.Names}}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return listed.stdout.decode().split()


@pytest.fixture
def no_probe_containers_left(testbed: None) -> object:
    yield None
    assert probe_containers() == []


@pytest.fixture
async def bridge(nursery: trio.Nursery, testbed: None) -> BridgeHandle:
    config = BridgeConfig(model="rollbridge/echo", token="probe-test-token-0123456789")
    handle: BridgeHandle = await nursery.start(run_bridge, config)
    return handle


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def probe(
    bridge: BridgeHandle,
    candidates: list[Candidate],
    *,
    network: str = "auto",
    exclusive: bool = False,
) -> ProbeReport:
    lines: list[str] = []
    report = await decide_route(
        engine="podman",
        image=IMAGE,
        network=network,
        bridge_port=bridge.port,
        candidates=candidates,
        exclusive=exclusive,
        nonce=NONCE,
        expect=bridge.probe_answer(NONCE),
        owner=owner_token(),
        log=lines.append,
    )
    for line in lines:
        print(line)
    assert len(lines) == len(report.attempts), "one log line per attempt"
    return report


async def test_default_network_loopback_refused_then_slirp_reached(
    bridge: BridgeHandle, no_probe_containers_left: None
) -> None:
    with trio.fail_after(120):
        began = time.monotonic()
        report = await probe(bridge, [Candidate("loopback", bridge.base_url)])
        wall = time.monotonic() - began
    loopback, slirp = report.attempts
    assert (loopback.candidate.kind, loopback.outcome) == ("loopback", "refused")
    assert loopback.elapsed_ms < 5000
    assert (slirp.candidate.kind, slirp.outcome) == ("slirp", "reached")
    assert slirp.candidate.url == f"http://10.0.2.2:{bridge.port}"
    assert report.route is not None and report.route.network_mode == SLIRP_NETWORK_MODE
    assert report.to_json()["reachable"] == f"http://10.0.2.2:{bridge.port}"
    print(f"default network: loopback+slirp in {wall:.1f} s")


async def test_no_network_skips_slirp_and_takes_the_relay(
    bridge: BridgeHandle, no_probe_containers_left: None
) -> None:
    if not relay_module_path().is_file():
        pytest.xfail(f"the exec relay is not there yet ({relay_module_path()})")
    with trio.fail_after(120):
        report = await probe(bridge, [Candidate("loopback", bridge.base_url)], network="none")
    assert [(a.candidate.kind, a.outcome) for a in report.attempts] == [
        ("loopback", "refused"),
        ("relay", "reached"),
    ]
    assert report.route is not None and report.route.kind == "relay"
    assert report.route.relay_target == ("127.0.0.1", bridge.port)
    assert report.route.base_url == "http://127.0.0.1:13131"


async def test_unreachable_advertise_url_is_the_only_candidate(
    bridge: BridgeHandle, no_probe_containers_left: None
) -> None:
    url = f"http://host.containers.internal:{closed_port()}"
    candidates = [Candidate("loopback", bridge.base_url), Candidate("advertise", url)]
    with trio.fail_after(120):
        report = await probe(bridge, candidates, exclusive=True)
    (attempt,) = report.attempts
    assert attempt.candidate.url == url and attempt.outcome == "refused"
    assert report.route is None
    line = describe_failure(
        report.to_json()["evidence"], advertise_url=url, bridge_port=bridge.port
    )
    assert line.startswith(f"--advertise-url {url} is not reachable from the sandbox: refused (")
    assert "\n" not in line


async def test_unresolvable_tunnel_is_dns_and_fast(
    bridge: BridgeHandle, no_probe_containers_left: None
) -> None:
    tunnel = Candidate("tunnel", "https://nonexistent-abc.trycloudflare.com")
    with trio.fail_after(120):
        report = await probe(
            bridge, [Candidate("loopback", bridge.base_url), tunnel], exclusive=True
        )
    (attempt,) = report.attempts
    assert attempt.outcome == "dns", attempt
    # The probe bounds a hanging lookup at 5 s (then it is "dns" too).
    assert attempt.elapsed_ms < 6000
    print(f"dns failure after {attempt.elapsed_ms:.0f} ms inside the sandbox")


async def test_cancelled_probe_leaves_no_container(
    bridge: BridgeHandle, no_probe_containers_left: None
) -> None:
    with trio.fail_after(120):
        for delay in (0.05, 0.3, 0.6, 1.0, 1.5):
            with trio.move_on_after(delay):
                await probe(bridge, [Candidate("loopback", bridge.base_url)], network="none")
    # no_probe_containers_left checks the engine


# -- the pure parts ---------------------------------------------------------------------------


def test_parse_python_and_curl_answers() -> None:
    line = json.dumps({"outcome": "refused", "detail": "x", "status": None, "body": None})
    assert parse_probe_output("noise\n" + line + "\n")["outcome"] == "refused"
    assert parse_probe_output("curl 7 000 Failed to connect\n")["outcome"] == "refused"
    assert parse_probe_output("curl 6 000 Could not resolve host\n")["outcome"] == "dns"
    assert parse_probe_output("curl 28 000 timed out\n")["outcome"] == "timeout"
    assert parse_probe_output("curl 7 000 No route to host\n")["outcome"] == "unreachable"
    http = parse_probe_output('curl 0 200 \n{"rollbridge_probe": "abc"}')
    assert http == {
        "outcome": "http",
        "detail": "HTTP 200",
        "status": 200,
        "body": '{"rollbridge_probe": "abc"}',
    }
    assert parse_probe_output("noprobe\n")["detail"] == "the sandbox has neither python3 nor curl"
    assert parse_probe_output("")["outcome"] == "error"


def test_classify_checks_the_nonce() -> None:
    answer = {"outcome": "http", "status": 200, "body": '{"rollbridge_probe": "abc"}'}
    assert classify(answer, "abc") == ("reached", "HTTP 200, nonce answered")
    assert classify(answer, "other")[0] == "wrong_server"
    assert classify({**answer, "status": 401, "body": "{}"}, None) == (
        "reached",
        "unverified (HTTP 401)",
    )
    assert classify({"outcome": "weird"}, "abc")[0] == "error"


def test_ladder_order() -> None:
    loop = Candidate("loopback", "http://127.0.0.1:9")
    adv = Candidate("advertise", "https://a.example")
    tun = Candidate("tunnel", "https://t.trycloudflare.com")
    kinds = [
        c.kind for c in ladder([loop, adv, tun], network="auto", bridge_port=9, exclusive=False)
    ]
    assert kinds == ["loopback", "slirp", "advertise", "relay", "tunnel"]
    kinds = [c.kind for c in ladder([loop], network="none", bridge_port=9, exclusive=False)]
    assert kinds == ["loopback", "relay"]
    assert ladder([loop, adv], network="auto", bridge_port=9, exclusive=True) == [adv]
