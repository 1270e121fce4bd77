"""HealthReport: the one reader of ``/health`` bodies (lenient, never raises on a server's body)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rollout_server.client import Health
from rollout_server.net.reply import Reply
from rollout_server.protocol import ChatEndpoint, HealthReport
from tunnel import TunnelPlan, choose_tunnel

# The bodies the two kinds of servers send (a sandbox backend, a LocalBackend).
HARBOR: dict[str, Any] = {
    "status": "ok",
    "backend": "harbor",
    "agent": "pkg.agents:Agent",
    "in_flight": 3,
    "running": 2,
    "queued": 1,
    "max_queue_depth": 16,
    "chat_endpoint": {"environment": "docker", "requires_public_url": True},
    "instance_id": "inst",
    "process_id": "proc",
    "lifecycle": {"accepting_rollouts": True, "active_rollouts": 3},
}
LOCAL: dict[str, Any] = {
    "status": "ok",
    "concurrency": {"max_concurrent": 4, "queued": 0, "running": 1},
    "instance_id": "inst",
    "process_id": "proc",
    "lifecycle": {"accepting_rollouts": False, "active_rollouts": 0},
}


def test_a_sandbox_backend_body() -> None:
    report = HealthReport.parse(HARBOR, {"x-osmosis-rollout-sdk-version": "1.2.3"})
    assert report == HealthReport(
        body=HARBOR,
        status="ok",
        instance_id="inst",
        process_id="proc",
        sdk_version="1.2.3",
        accepting_rollouts=True,
        active_rollouts=3,
        backend="harbor",
        agent="pkg.agents:Agent",
        in_flight=3,
        running=2,
        queued=1,
        max_queue_depth=16,
        chat_endpoint=ChatEndpoint(environment="docker", requires_public_url=True),
    )
    assert report.capacity == 16
    assert report.requires_public_url is True
    assert report.chat_environment == "docker"


def test_a_local_backend_body() -> None:
    report = HealthReport.parse(LOCAL)
    assert report is not None
    assert (report.max_concurrent, report.capacity, report.max_queue_depth) == (4, 4, None)
    assert (report.accepting_rollouts, report.active_rollouts) == (False, 0)
    assert report.chat_endpoint is None and report.requires_public_url is False
    assert report.sdk_version is None


def test_the_instance_id_header_wins_over_the_body() -> None:
    headers = httpx.Headers({"X-Osmosis-Rollout-Instance-Id": "from-header"})
    report = HealthReport.parse({"instance_id": "from-body"}, headers)
    assert report is not None and report.instance_id == "from-header"
    report = HealthReport.parse({"instance_id": "from-body"}, {"x-osmosis-rollout-instance-id": ""})
    assert report is not None and report.instance_id == "from-body"


@pytest.mark.parametrize(
    "body",
    [
        {
            "status": 1,
            "backend": ["x"],
            "agent": None,
            "in_flight": -1,
            "running": True,
            "queued": 1.5,
            "max_queue_depth": "8",
            "instance_id": 7,
            "process_id": "",
            "lifecycle": {"accepting_rollouts": "yes", "active_rollouts": -2},
            "concurrency": {"max_concurrent": True},
            "chat_endpoint": {"environment": 7, "requires_public_url": "true"},
        },
        {"lifecycle": [], "concurrency": "4", "chat_endpoint": "docker"},
        {},
    ],
)
def test_wrong_types_read_as_absent(body: dict[str, Any]) -> None:
    report = HealthReport.parse(body)
    assert report is not None
    endpoint = report.chat_endpoint
    assert endpoint is None or endpoint == ChatEndpoint()
    assert report == HealthReport(body=body, chat_endpoint=endpoint)
    assert report.capacity is None


@pytest.mark.parametrize(
    ("body", "capacity"),
    [
        ({"max_queue_depth": 3, "concurrency": {"max_concurrent": 8}}, 3),
        # A depth that is no cap (0, negative, bool, missing) falls back to max_concurrent.
        ({"max_queue_depth": 0, "concurrency": {"max_concurrent": 8}}, 8),
        ({"max_queue_depth": -1, "concurrency": {"max_concurrent": 8}}, 8),
        ({"max_queue_depth": True, "concurrency": {"max_concurrent": 8}}, 8),
        ({"max_queue_depth": None, "concurrency": {"max_concurrent": 8}}, 8),
        ({"concurrency": {"max_concurrent": None}}, None),
        ({"concurrency": {"max_concurrent": 0}}, None),
        ({"max_queue_depth": 2.0}, None),
    ],
)
def test_capacity_rule(body: dict[str, Any], capacity: int | None) -> None:
    report = HealthReport.parse(body)
    assert report is not None and report.capacity == capacity


@pytest.mark.parametrize("data", [b"[1, 2]", b"null", b"not json", b"", b'"ok"'])
def test_a_body_that_is_not_an_object_is_none(data: bytes) -> None:
    assert HealthReport.from_json(data) is None


@pytest.mark.parametrize("body", [None, [], "ok", 3])
def test_a_decoded_body_that_is_not_an_object_is_none(body: object) -> None:
    assert HealthReport.parse(body) is None


def test_from_json_and_the_client_view() -> None:
    headers = [(b"x-osmosis-rollout-instance-id", b"h"), (b"x-osmosis-rollout-sdk-version", b"9")]
    health = Health.from_response(Reply(200, headers, json.dumps(LOCAL).encode()))
    assert health is not None
    assert (health.status_code, health.instance_id, health.sdk_version) == (200, "h", "9")
    assert health.headers["x-osmosis-rollout-instance-id"] == "h"
    assert health.body == LOCAL and health.capacity == 4
    assert Health.from_response(Reply(200, [], b"[]")) is None


HARBOR_DOCKER = {
    "status": "ok",
    "chat_endpoint": {"environment": " docker ", "requires_public_url": True},
}


@pytest.mark.parametrize(
    ("health", "label"),
    [
        (HARBOR_DOCKER, "docker"),
        ({"chat_endpoint": {"requires_public_url": True}}, "remote"),
        ({"chat_endpoint": {"requires_public_url": True, "environment": "   "}}, "remote"),
        ({"chat_endpoint": {"requires_public_url": True, "environment": 7}}, "remote"),
        ({"chat_endpoint": {"requires_public_url": "true", "environment": "daytona"}}, None),
        ({"chat_endpoint": {"requires_public_url": 1, "environment": "daytona"}}, None),
        ({"chat_endpoint": {"requires_public_url": False, "environment": "docker"}}, None),
        ({"chat_endpoint": "docker"}, None),
        (LOCAL, None),
        ({}, None),
    ],
)
def test_public_chat_endpoint_detection(health: dict[str, Any], label: str | None) -> None:
    """The report feeds the tunnel decision: only JSON ``true`` asks for a public URL."""
    report = HealthReport.parse(health)
    assert report is not None
    decision = choose_tunnel(
        TunnelPlan(),
        requires_public_url=report.requires_public_url,
        environment=report.chat_environment,
    )
    assert decision.environment == label
