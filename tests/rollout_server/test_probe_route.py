"""POST /v1/rollbridge/probe-chat-endpoint (rollout_server/probe_route.py) and the ``probe``
field of ``chat_endpoint`` in /health."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from rollout_server.backend import ExecutionBackend, ExecutionOutcome, ExecutionRequest
from rollout_server.client import RolloutProtocolError
from rollout_server.harbor.route import CANDIDATE_KINDS
from rollout_server.probe_route import CANDIDATE_KINDS as WIRE_KINDS
from rollout_server.probe_route import PROBE_ROUTE
from rollout_server.protocol import HealthReport

from .helpers import start

GOOD = {
    "nonce": "ab" * 16,
    "expect": "e" * 64,
    "candidates": [
        {"kind": "loopback", "url": "http://127.0.0.1:9"},
        {"kind": "advertise", "url": "https://proxy.example/llm"},
    ],
    "exclusive": True,
}
REPORT = {"reachable": "http://10.0.2.2:9", "route": {"kind": "slirp"}, "evidence": []}


class ProbingBackend(ExecutionBackend):
    """Answers the probe with a canned report and remembers what it was asked."""

    def __init__(self, fail: bool = False) -> None:
        self.asked: list[dict[str, Any]] = []
        self.fail = fail

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        raise AssertionError("no rollout is admitted in these tests")

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "chat_endpoint": {
                "environment": "podman",
                "requires_public_url": False,
                "probe": PROBE_ROUTE,
            },
        }

    async def probe_chat_endpoint(self, request: dict[str, Any]) -> dict[str, Any] | None:
        self.asked.append(request)
        if self.fail:
            raise RuntimeError("image build failed:\nno space left")
        return REPORT


def test_wire_kinds_are_the_route_kinds() -> None:
    assert WIRE_KINDS == CANDIDATE_KINDS


async def test_local_backend_has_no_probe(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(20):
        running, client = await start(nursery, tmp_path)
        async with httpx.AsyncClient() as http:
            response = await http.post(running.url + PROBE_ROUTE, json=GOOD)
        assert response.status_code == 404
        assert response.json() == {"detail": "this rollout server has no sandbox probe"}
        assert await client.probe_chat_endpoint(**_args(GOOD)) is None
        health = await client.health()
        assert health.chat_probe is None
        await client.aclose()


def _args(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("nonce", "expect", "candidates", "exclusive")}


async def test_probing_backend_answers_its_report(nursery: trio.Nursery, tmp_path: Path) -> None:
    backend = ProbingBackend()
    with trio.fail_after(20):
        _, client = await start(nursery, tmp_path, backend)
        health = await client.health()
        assert health.chat_probe == PROBE_ROUTE
        assert health.chat_endpoint is not None and health.chat_endpoint.probe == PROBE_ROUTE
        assert not health.requires_public_url
        assert await client.probe_chat_endpoint(**_args(GOOD), path=health.chat_probe) == REPORT
        await client.aclose()
    assert backend.asked == [GOOD]


async def test_expect_may_be_null_and_exclusive_defaults_false(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    backend = ProbingBackend()
    body = {"nonce": "n", "expect": None, "candidates": [GOOD["candidates"][0]]}
    with trio.fail_after(20):
        running, _ = await start(nursery, tmp_path, backend)
        async with httpx.AsyncClient() as http:
            response = await http.post(running.url + PROBE_ROUTE, json=body)
    assert response.status_code == 200
    assert backend.asked == [{**body, "exclusive": False}]


BAD = [
    (b"not json", "the body must be a JSON object"),
    (b"[1, 2]", "the body must be a JSON object"),
    ({**GOOD, "nonce": "a/b"}, "nonce must be 1-128 characters of [A-Za-z0-9_-]"),
    ({**GOOD, "nonce": "a" * 129}, "nonce must be 1-128 characters of [A-Za-z0-9_-]"),
    ({**GOOD, "expect": 7}, "expect must be a non-empty string (or null)"),
    ({**GOOD, "exclusive": "yes"}, "exclusive must be true or false"),
    ({**GOOD, "candidates": []}, "candidates must be a list of 1 to 16 objects"),
    ({**GOOD, "candidates": [{"kind": "ftp", "url": "http://x"}]}, "candidates[0].kind must be"),
    ({**GOOD, "candidates": [{"kind": "tunnel", "url": "ftp://x"}]}, "candidates[0].url must be"),
    ({**GOOD, "candidates": [{"kind": "tunnel"}]}, "candidates[0] must be an object with"),
    ({**GOOD, "extra": 1}, "unknown field(s): extra"),
]


@pytest.mark.parametrize(("body", "detail"), BAD)
async def test_bad_body_is_400_with_one_line(
    nursery: trio.Nursery, tmp_path: Path, body: Any, detail: str
) -> None:
    backend = ProbingBackend()
    with trio.fail_after(20):
        running, _ = await start(nursery, tmp_path, backend)
        async with httpx.AsyncClient() as http:
            if isinstance(body, bytes):
                kwargs: dict[str, Any] = {"content": body}
            else:
                kwargs = {"json": body}
            response = await http.post(
                running.url + PROBE_ROUTE, headers={"content-type": "application/json"}, **kwargs
            )
    assert response.status_code == 400
    answer = response.json()["detail"]
    assert answer.startswith(detail) and "\n" not in answer
    assert backend.asked == []


async def test_get_is_405_and_a_failing_backend_is_500_one_line(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(20):
        running, client = await start(nursery, tmp_path, ProbingBackend(fail=True))
        async with httpx.AsyncClient() as http:
            assert (await http.get(running.url + PROBE_ROUTE)).status_code == 405
        with pytest.raises(RolloutProtocolError) as info:
            await client.probe_chat_endpoint(**_args(GOOD))
        await client.aclose()
    assert info.value.status_code == 500
    assert info.value.detail == "the sandbox probe failed: image build failed: no space left"


def test_health_probe_field_is_optional_and_lenient() -> None:
    base = {"chat_endpoint": {"environment": "podman", "requires_public_url": False}}
    report = HealthReport.parse(base)
    assert report is not None and report.chat_probe is None
    for probe, seen in ((PROBE_ROUTE, PROBE_ROUTE), (7, None), ("", None), ("relative", None)):
        body = {"chat_endpoint": {**base["chat_endpoint"], "probe": probe}}
        report = HealthReport.parse(body)
        assert report is not None and report.chat_probe == seen
