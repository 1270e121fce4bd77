"""The batched result wait, ``POST /v1/rollbridge/wait-results`` (docs/spec/protocol.md §3.5):
in virtual time against the registry, and over HTTP against a real server on port 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from launcher import resultwait as client_side
from rollout_server import resultwait
from rollout_server.client import InvalidRolloutRequest
from rollout_server.resultwait import CAPABILITY, WAIT_ROUTE, ResultWaits
from tests.rollout_server.helpers import gate, request, start
from tests.wire_attacks import post_head, stalled_body

from .conftest import Served
from .test_service import SleepyBackend, final, req, started

WAITER = "w" * 32


def wait_body(**fields: Any) -> dict[str, Any]:
    return {"waiter": WAITER, **fields}


async def answer(waits: ResultWaits, **fields: Any) -> dict[str, Any]:
    status, body = await waits.answer(wait_body(**fields))
    assert status == 200, body
    decoded: dict[str, Any] = msgspec.json.decode(body)
    return decoded


def ids(reply: dict[str, Any]) -> list[str]:
    return [result["rollout_id"] for result in reply["results"]]


def test_the_launcher_names_the_same_route_and_capability() -> None:
    assert client_side.WAIT_ROUTE == resultwait.WAIT_ROUTE
    assert client_side.CAPABILITY == resultwait.CAPABILITY
    assert client_side.WAITER_HEADER == resultwait.WAITER_HEADER


async def test_answers_the_first_ready_result_and_keeps_watching_the_rest(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend(), result_wait_timeout_sec=30.0)
    waits = ResultWaits(service)
    tokens = {
        i: service.admit(req(i, sleep=s))["polling_lease_token"]
        for i, s in (("a", 5), ("b", 50), ("c", 100))
    }
    start_at = trio.current_time()
    first = await answer(waits, add=tokens)
    assert ids(first) == ["a"]
    assert first["results"][0]["status"] == "success"
    assert trio.current_time() - start_at == 5.0
    assert first["watching"] == 2 and first["rejected"] == {} and first["more"] is False
    # Nothing ready and nothing new: the wait is held for its timeout, then answers empty.
    second = await answer(waits, ack=["a"], timeout_sec=10)
    assert second["results"] == [] and second["watching"] == 2
    assert trio.current_time() - start_at == 15.0


async def test_a_wait_is_held_at_most_the_hold_time(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend(), result_wait_timeout_sec=30.0)
    waits = ResultWaits(service)
    token = service.admit(req("a"))["polling_lease_token"]
    before = trio.current_time()
    reply = await answer(waits, add={"a": token}, timeout_sec=1e9)
    assert reply["results"] == [] and reply["watching"] == 1
    assert trio.current_time() - before == 30.0


async def test_a_result_is_answered_until_acknowledged_then_never_again(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend())
    waits = ResultWaits(service)
    tokens = {i: service.admit(req(i, sleep=1))["polling_lease_token"] for i in ("a", "b")}
    assert ids(await answer(waits, add=tokens)) != []
    await trio.sleep(1)
    again = await answer(waits, timeout_sec=0)  # nothing acknowledged: both again
    assert sorted(ids(again)) == ["a", "b"]
    # The bodies are the per-id poll's final bodies, byte for byte.
    polled = msgspec.json.decode(await service.poll("a", tokens["a"]))
    assert polled in again["results"]
    acked = await answer(waits, ack=["a", "b"], timeout_sec=5)
    assert acked["results"] == [] and acked["watching"] == 0


async def test_unknown_ids_and_wrong_tokens_are_refused_per_id(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend())
    waits = ResultWaits(service)
    token = service.admit(req("a"))["polling_lease_token"]
    service.admit(req("b"))
    reply = await answer(waits, add={"a": token, "b": token, "nope": token})
    assert reply["rejected"] == {
        "b": {"status": 403, "detail": "invalid polling lease"},
        "nope": {"status": 404, "detail": "unknown rollout_id"},
    }
    assert reply["watching"] == 1


async def test_waiting_renews_the_leases_and_a_silent_waiter_loses_them(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    backend = SleepyBackend()
    service = await started(
        nursery, backend, result_wait_timeout_sec=30.0, polling_lease_timeout_sec=120.0
    )
    waits = ResultWaits(service)
    tokens = {i: service.admit(req(i))["polling_lease_token"] for i in ("a", "b")}
    for _ in range(10):  # 300 s of waits, past two lease times
        assert (await answer(waits, add=tokens))["results"] == []
    assert backend.cancelled == []
    await trio.sleep(121)  # nobody waits: both leases run out and the rollouts are cancelled
    assert sorted(backend.cancelled) == ["a", "b"]
    for rollout_id, token in tokens.items():
        assert (await final(service, rollout_id, token))["err_category"] == "lease_expired"
    # ... and the waiter itself is forgotten: a wait under its name starts from nothing.
    assert (await answer(waits, timeout_sec=0))["watching"] == 0


async def test_the_stop_answers_a_held_wait(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend(), result_wait_timeout_sec=30.0)
    waits = ResultWaits(service)
    token = service.admit(req("a"))["polling_lease_token"]
    replies: list[dict[str, Any]] = []

    async def wait() -> None:
        replies.append(await answer(waits, add={"a": token}))

    nursery.start_soon(wait)
    await trio.testing.wait_all_tasks_blocked()
    assert waits.waiting == 1
    before = trio.current_time()
    service.close()
    await trio.testing.wait_all_tasks_blocked()
    assert replies and trio.current_time() == before


async def test_bad_wait_bodies_are_422_with_one_line(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend())
    waits = ResultWaits(service)
    for body in (
        [],
        {"waiter": "short"},
        wait_body(add=["a"]),
        wait_body(add={"a": ""}),
        wait_body(ack=[1]),
        wait_body(ack=["a"] * (resultwait.MAX_IDS + 1)),
        wait_body(timeout_sec="soon"),
    ):
        status, payload = await waits.answer(body)
        assert status == 422, body
        detail = msgspec.json.decode(payload)["detail"]
        assert isinstance(detail, str) and "\n" not in detail


# -- over HTTP ------------------------------------------------------------------------------


async def test_health_offers_the_wait_and_the_route_serves_it(served: Served) -> None:
    with trio.fail_after(20):
        health = await served.client.health()
        assert CAPABILITY in health.body["rollbridge_capabilities"]
        gate("rw-http").set()
        admission = await served.client.admit(request("rw1", metadata={"gate": "rw-http"}))
        body = wait_body(add={admission.rollout_id: admission.token})
        reply = await served.http.post(WAIT_ROUTE, json=body)
        assert reply.status_code == 200
        results = reply.json()["results"]
        assert [r["rollout_id"] for r in results] == ["rw1"]
        assert results[0]["status"] in ("success", "failure")
        assert (await served.http.get(WAIT_ROUTE)).status_code == 405
        bad = await served.http.post(
            WAIT_ROUTE, content=b"{", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 422


async def test_the_bearer_is_checked_before_the_body_and_the_body_is_bounded(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        running, _ = await start(nursery, tmp_path, api_key="sekrit")
        unauthenticated = await stalled_body(running.port, post_head(WAIT_ROUTE))
        auth = b"authorization: Bearer sekrit\r\n"
        too_large = await stalled_body(running.port, post_head(WAIT_ROUTE, extra=auth))
    assert unauthenticated.startswith(b"HTTP/1.1 401 ")
    assert too_large.startswith(b"HTTP/1.1 413 ")


async def test_an_admission_with_the_waiter_header_is_watched_without_an_add(
    served: Served,
) -> None:
    with trio.fail_after(20):
        header = {resultwait.WAITER_HEADER: WAITER}
        served.client.admission_headers.update(header)
        await served.client.admit(request("rw-h1", metadata={"gate": "rw-header"}))
        served.client.admission_headers.update({resultwait.WAITER_HEADER: "no good"})
        with pytest.raises(InvalidRolloutRequest) as refused:
            await served.client.admit(request("rw-h2"))
        assert "x-rollbridge-waiter must be" in str(refused.value.detail)
        assert served.running.service.status_of("rw-h2") is None
        first = (await served.http.post(WAIT_ROUTE, json=wait_body(timeout_sec=0))).json()
        assert first["results"] == [] and first["watching"] == 1
        gate("rw-header").set()
        second = (await served.http.post(WAIT_ROUTE, json=wait_body())).json()
    assert [r["rollout_id"] for r in second["results"]] == ["rw-h1"]
