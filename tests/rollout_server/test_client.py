"""The async client's retry rules and typed errors (docs/spec/protocol.md §11), via httpx transports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from rollout_server.client import (
    Admission,
    AdmissionRejected,
    CapacityExhausted,
    InvalidRolloutRequest,
    RolloutAdmissionTimeout,
    RolloutClient,
    RolloutIdConflict,
    RolloutProtocolError,
    RolloutServerUnreachable,
)
from rollout_server.net.wireerrors import ConnectFailed
from rollout_server.protocol import RequestValidationError, RolloutStatus

from .helpers import request, start

ACCEPTED = {
    "rollout_id": "r",
    "status": "queued",
    "polling_lease_token": "t" * 43,
    "result_wait_timeout_sec": 30.0,
    "polling_lease_timeout_sec": 120.0,
}
RUNNING = {
    "rollout_id": "r",
    "status": "running",
    "sample": None,
    "err_message": None,
    "err_category": None,
}
DONE = {**RUNNING, "status": "success", "sample": {"messages": [], "reward": 1.0}}


def scripted(responses: list[Any], calls: list[httpx.Request], **options: Any) -> RolloutClient:
    """A client whose transport answers from ``responses`` (exceptions are raised).

    ``options`` go to :class:`RolloutClient` (e.g. ``server_alive``)."""

    async def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        item = responses.pop(0)
        if isinstance(item, Exception):
            raise item
        status, body, *headers = item
        return httpx.Response(status, json=body, headers=headers[0] if headers else None)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return RolloutClient("http://server/", http_client=http, **options)


def admission(deadline: float = 120.0) -> Admission:
    return Admission("r", "t" * 43, 30.0, 120.0, trio.current_time() + deadline)


async def test_admission_retries_429_with_retry_after(autojump_clock: Any) -> None:
    calls: list[httpx.Request] = []
    client = scripted(
        [
            (429, {}, {"Retry-After": "5"}),
            (429, {}),
            (429, {}, {"Retry-After": "999"}),
            (202, ACCEPTED),
        ],
        calls,
    )
    start = trio.current_time()
    got = await client.admit(request("r"))
    assert got.token == "t" * 43
    # 5 s, then the 1 s default, then clamped to 60 s.
    assert trio.current_time() - start == pytest.approx(66.0)
    assert len(calls) == 4
    assert calls[0].headers["content-type"] == "application/json"
    body = calls[0].read()
    assert b'"llm_api_key":null' in body and b'"extra_fields":null' in body


async def test_admission_timeout(autojump_clock: Any) -> None:
    client = scripted([(429, {}, {"Retry-After": "10"})] * 5, [])
    with pytest.raises(RolloutAdmissionTimeout) as info:
        await client.admit(request("r"), admission_timeout_sec=25.0)
    assert info.value.maybe_admitted is False
    assert isinstance(info.value, TimeoutError)


@pytest.mark.parametrize(
    ("status", "error"),
    [(409, RolloutIdConflict), (422, InvalidRolloutRequest), (500, AdmissionRejected)],
)
async def test_admission_refusals_are_typed(status: int, error: type[Exception]) -> None:
    client = scripted([(status, {"detail": "no"})], [])
    with pytest.raises(error) as info:
        await client.admit(request("r"))
    assert info.value.status_code == status  # type: ignore[attr-defined]
    assert info.value.detail == "no"  # type: ignore[attr-defined]


async def test_admit_once_reports_429() -> None:
    client = scripted([(429, {"detail": "full"}, {"Retry-After": "0"})], [])
    with pytest.raises(CapacityExhausted) as info:
        await client.admit_once(request("r"))
    assert info.value.retry_after == 0.05


@pytest.mark.parametrize(
    "bad",
    [
        {**ACCEPTED, "rollout_id": "other"},
        {**ACCEPTED, "polling_lease_timeout_sec": 30.0},
        {**ACCEPTED, "polling_lease_token": ""},
        {"rollout_id": "r"},
    ],
)
async def test_bad_admission_bodies_are_protocol_errors(bad: dict[str, Any]) -> None:
    client = scripted([(202, bad)], [])
    with pytest.raises(RolloutProtocolError):
        await client.admit(request("r"))


async def test_invalid_requests_fail_before_sending() -> None:
    with pytest.raises(RequestValidationError):
        request("a/b").validate()


async def test_result_retries_gateway_errors_then_succeeds(autojump_clock: Any) -> None:
    calls: list[httpx.Request] = []
    client = scripted([(502, {}), (503, {}), (504, {}), (200, DONE)], calls)
    result = await client.poll_once(admission())
    assert result.status == RolloutStatus.SUCCESS
    assert calls[0].headers["X-Osmosis-Rollout-Lease"] == "t" * 43


async def test_result_retries_transport_errors_twice(autojump_clock: Any) -> None:
    boom = httpx.ConnectError("refused")
    client = scripted([boom, boom, (200, DONE)], [])
    assert (await client.poll_once(admission())).status == RolloutStatus.SUCCESS
    client = scripted([boom, boom, boom, (200, DONE)], [])
    with pytest.raises(RolloutServerUnreachable):
        await client.poll_once(admission())


async def test_result_gives_up_at_the_lease_deadline(autojump_clock: Any) -> None:
    # With 40.5 s of lease left, 0.25 + 40 s request timeout fits once, then 0.5 + 40 does not.
    client = scripted([(503, {}), (503, {}), (200, DONE)], [])
    with pytest.raises(RolloutProtocolError) as info:
        await client.poll_once(admission(deadline=40.5))
    assert info.value.status_code == 503


@pytest.mark.parametrize("status", [401, 403, 404, 409, 422, 429, 500])
async def test_result_does_not_retry_other_codes(status: int) -> None:
    calls: list[httpx.Request] = []
    client = scripted([(status, {"detail": "x"}), (200, DONE)], calls)
    with pytest.raises(RolloutProtocolError) as info:
        await client.poll_once(admission())
    assert info.value.status_code == status
    assert len(calls) == 1


@pytest.mark.parametrize(
    "body",
    [{**DONE, "rollout_id": "other"}, {**DONE, "status": "exploded"}, {"rollout_id": "r"}],
)
async def test_result_body_checks(body: dict[str, Any]) -> None:
    client = scripted([(200, body)], [])
    with pytest.raises(RolloutProtocolError):
        await client.poll_once(admission())


async def test_unknown_status_is_not_terminal_and_callback_sees_changes() -> None:
    seen: list[str] = []
    client = scripted(
        [(200, {**RUNNING, "status": "unknown"}), (200, RUNNING), (200, RUNNING), (200, DONE)], []
    )

    async def note(result: Any) -> None:
        seen.append(result.status.value)

    result = await client.wait_for_result(admission(), on_status=note)
    assert result.sample is not None and result.sample.reward == 1.0
    assert seen == ["unknown", "running", "success"]


async def test_lease_deadline_renews_from_send_time(autojump_clock: Any) -> None:
    client = scripted([(200, RUNNING)], [])
    a = admission(deadline=5.0)
    await trio.sleep(3.0)
    await client.poll_once(a)
    assert a.lease_deadline == pytest.approx(trio.current_time() + 120.0)


# -- the connect-phase retry (only with server_alive) ------------------------------------------

REFUSED = httpx.ConnectError("refused")
CONNECT_TIMEOUT = httpx.ConnectTimeout("no SYN-ACK")


def alive() -> bool:
    return True


@pytest.mark.parametrize("failure", [REFUSED, CONNECT_TIMEOUT])
async def test_admission_resends_after_connect_failures(
    autojump_clock: Any, failure: Exception
) -> None:
    calls: list[httpx.Request] = []
    client = scripted([failure, failure, failure, (202, ACCEPTED)], calls, server_alive=alive)
    start = trio.current_time()
    got = await client.admit(request("r"), admission_timeout_sec=60.0)
    assert got.rollout_id == "r"
    assert len(calls) == 4
    assert trio.current_time() - start == pytest.approx(0.05 + 0.1 + 0.2)


async def test_connect_backoff_doubles_to_two_seconds(autojump_clock: Any) -> None:
    calls: list[httpx.Request] = []
    client = scripted([REFUSED] * 8 + [(202, ACCEPTED)], calls, server_alive=alive)
    start = trio.current_time()
    await client.admit(request("r"))
    assert len(calls) == 9
    assert trio.current_time() - start == pytest.approx(
        0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 2.0 + 2.0
    )


async def test_connect_retry_and_429_share_the_admission_deadline(autojump_clock: Any) -> None:
    calls: list[httpx.Request] = []
    client = scripted(
        [REFUSED, (429, {}, {"Retry-After": "0.3"}), REFUSED, (202, ACCEPTED)],
        calls,
        server_alive=alive,
    )
    start = trio.current_time()
    await client.admit(request("r"), admission_timeout_sec=5.0)
    assert len(calls) == 4
    # The backoff is not reset by the 429 in between: 0.05, 0.3 (Retry-After), then 0.1.
    assert trio.current_time() - start == pytest.approx(0.45)


async def test_connect_retry_stops_before_the_admission_deadline(autojump_clock: Any) -> None:
    calls: list[httpx.Request] = []
    client = scripted([REFUSED] * 10, calls, server_alive=alive)
    start = trio.current_time()
    with pytest.raises(RolloutServerUnreachable) as info:
        await client.admit(request("r"), admission_timeout_sec=1.0)
    # 0.05 + 0.1 + 0.2 + 0.4 = 0.75 s; the next 0.8 s would pass the deadline, so the
    # failure is raised as it is (no admission timeout: nothing was in flight).
    assert trio.current_time() - start == pytest.approx(0.75)
    assert len(calls) == 5
    assert isinstance(info.value.__cause__, ConnectFailed)


@pytest.mark.parametrize(
    ("failure", "options"),
    [
        (REFUSED, {}),  # no server_alive: the rule is off
        (REFUSED, {"server_alive": lambda: False}),  # the server process is gone
        (httpx.ReadError("reset"), {"server_alive": alive}),  # the request may have arrived
        (httpx.RemoteProtocolError("eof"), {"server_alive": alive}),
    ],
)
async def test_admission_does_not_resend_otherwise(
    autojump_clock: Any, failure: Exception, options: dict[str, Any]
) -> None:
    calls: list[httpx.Request] = []
    client = scripted([failure, (202, ACCEPTED)], calls, **options)
    with pytest.raises(RolloutServerUnreachable):
        await client.admit(request("r"))
    assert len(calls) == 1


async def test_result_wait_resends_after_connect_failures(autojump_clock: Any) -> None:
    calls: list[httpx.Request] = []
    seen: list[str] = []
    client = scripted(
        [CONNECT_TIMEOUT, CONNECT_TIMEOUT, (200, RUNNING), CONNECT_TIMEOUT, (200, DONE)],
        calls,
        server_alive=alive,
    )
    start = trio.current_time()
    result = await client.wait_for_result(admission(), on_status=lambda r: seen.append(r.status))
    assert result.status == RolloutStatus.SUCCESS
    assert len(calls) == 5
    # One backoff for the whole wait: 0.05, 0.1, then 0.2 after the answered poll.
    assert trio.current_time() - start == pytest.approx(0.35)
    assert seen == ["running", "success"]


async def test_result_wait_retries_over_the_poll_retries(autojump_clock: Any) -> None:
    # poll_once retries a refused connection twice (0.1 s, 0.5 s) itself; then the
    # connect-phase rule sends the poll again after 0.05 s.
    calls: list[httpx.Request] = []
    client = scripted([REFUSED, REFUSED, REFUSED, (200, DONE)], calls, server_alive=alive)
    start = trio.current_time()
    assert (await client.wait_for_result(admission())).status == RolloutStatus.SUCCESS
    assert len(calls) == 4
    assert trio.current_time() - start == pytest.approx(0.1 + 0.5 + 0.05)


async def test_result_wait_keeps_a_second_of_lease(autojump_clock: Any) -> None:
    calls: list[httpx.Request] = []
    client = scripted([CONNECT_TIMEOUT] * 10, calls, server_alive=alive)
    start = trio.current_time()
    with pytest.raises(RolloutServerUnreachable):
        await client.wait_for_result(admission(deadline=1.5))
    # Resent at 0.05, 0.15 and 0.35 s; at 0.35 s, 0.35 + 0.4 + 1 s reaches the deadline.
    assert len(calls) == 4
    assert trio.current_time() - start == pytest.approx(0.35)


@pytest.mark.parametrize(
    ("failure", "options"),
    [
        (CONNECT_TIMEOUT, {}),
        (CONNECT_TIMEOUT, {"server_alive": lambda: False}),
        (httpx.ReadTimeout("slow"), {"server_alive": alive}),
    ],
)
async def test_result_wait_does_not_resend_otherwise(
    autojump_clock: Any, failure: Exception, options: dict[str, Any]
) -> None:
    calls: list[httpx.Request] = []
    # A read timeout is retried twice by poll_once itself, and no more.
    client = scripted([failure] * 3 + [(200, DONE)], calls, **options)
    with pytest.raises(RolloutServerUnreachable):
        await client.wait_for_result(admission())
    assert len(calls) == (3 if isinstance(failure, httpx.ReadTimeout) else 1)


async def test_unreachable_server_is_typed(tmp_path: Path) -> None:
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with trio.fail_after(10):
        async with RolloutClient(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(RolloutServerUnreachable):
                await client.health()
            with pytest.raises(RolloutServerUnreachable):
                await client.admit(request("r"))
            with pytest.raises(RolloutServerUnreachable):
                await client.cancel(all=True)


async def test_server_death_while_polling_is_unreachable(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(20):
        running, client = await start(
            nursery, tmp_path, result_wait_timeout_sec=1.0, polling_lease_timeout_sec=5.0
        )
        a = await client.admit(request("dies", label="L", metadata={"gate": "dies-never"}))
        running.force_stop()
        while True:
            try:
                await client.poll_once(a)
            except (RolloutServerUnreachable, RolloutProtocolError) as exc:
                if isinstance(exc, RolloutServerUnreachable):
                    break
            await trio.sleep(0.05)
        await client.aclose()


def test_cancel_needs_exactly_one_selector() -> None:
    client = RolloutClient("http://x")

    async def call(fn: Callable[[], Any]) -> None:
        await fn()

    with pytest.raises(ValueError):
        trio.run(call, lambda: client.cancel())
    with pytest.raises(ValueError):
        trio.run(call, lambda: client.cancel(["a"], all=True))


async def test_wait_idle_and_restart_detection(autojump_clock: Any) -> None:
    def health(pid: str, active: int) -> tuple[int, dict[str, Any]]:
        return (
            200,
            {
                "process_id": pid,
                "lifecycle": {"accepting_rollouts": True, "active_rollouts": active},
            },
        )

    client = scripted([health("p1", 2), (503, {}), httpx.ConnectError("x"), health("p1", 0)], [])
    assert (await client.wait_idle(poll_interval_sec=0.5)).active_rollouts == 0
    client = scripted([health("p1", 1), health("p2", 0)], [])
    with pytest.raises(RolloutProtocolError, match="restarted"):
        await client.wait_idle()
    client = scripted([(200, {"lifecycle": {}})], [])
    with pytest.raises(RolloutProtocolError, match="lifecycle identity"):
        await client.wait_idle()


async def test_a_plain_http_run_never_builds_an_httpx_client(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Health, admission and the long-poll all go through the lean pool: the httpx client (64
    transports and the CA bundle) is made only for a call that needs it, here a cancel."""
    with trio.fail_after(20):
        _running, client = await start(nursery, tmp_path)
        health = await client.health()
        assert health.status_code == 200 and health.headers["content-type"] == "application/json"
        assert health.instance_id == "test-instance"
        result = await client.run_rollout(request("lean", label="L"))
        assert result.status == RolloutStatus.SUCCESS
        assert "_http" not in client.__dict__
        await client.cancel(all=True)
        assert "_http" in client.__dict__
        await client.aclose()
