"""Revoked rollout ids (bridge.revoke): a real bridge process on port 0, the official clients.

A revoked id is refused on every route (chat completions, responses, messages, count_tokens)
with a 410 in the caller's API's shape, before any upstream call and before its body is read;
another id keeps working; the refusals count nowhere and are logged once; a call of the id in
flight when the revocation arrives is cancelled (its upstream request too) and answered 410.
An ended rollout (its usage taken by the supervisor, which tells the bridge to forget it) is
refused the same way, the newest ``FINISHED_KEEP`` of them.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from bridge.process import BridgeProcessHandle, run_bridge_process
from bridge.revoke import REVOKED_STATUS, Revocations
from bridge.server import BridgeConfig
from tests.bridge.conftest import AUTH, HI, TOKEN, StartBridge
from tests.fakes.upstream import FakeUpstream

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

ECHO = "rollbridge/echo"


async def _start(nursery: trio.Nursery, model: str, log: list[str]) -> BridgeProcessHandle:
    config = BridgeConfig(model=model, token=TOKEN, log=lambda level, line: log.append(line))
    handle: BridgeProcessHandle = await nursery.start(
        lambda task_status: run_bridge_process(
            config, redact_values=(TOKEN,), task_status=task_status
        )
    )
    return handle


def _every_route(base_url: str) -> dict[str, Any]:
    """One call on each route with the official clients: its answer, or the status it raised."""
    oai = openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    claude = anthropic.Anthropic(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=20)
    hi = [{"role": "user", "content": "hi there"}]
    calls: dict[str, Any] = {
        "chat": lambda: oai.chat.completions.create(model="m", messages=hi),
        "chat stream": lambda: list(
            oai.chat.completions.create(model="m", messages=hi, stream=True)
        ),
        "responses": lambda: oai.responses.create(model="m", input="hi there"),
        "messages": lambda: claude.messages.create(model="c", max_tokens=16, messages=hi),
        "count_tokens": lambda: claude.messages.count_tokens(model="c", messages=hi),
    }
    out: dict[str, Any] = {}
    for name, call in calls.items():
        try:
            out[name] = call()
        except (openai.APIStatusError, anthropic.APIStatusError) as exc:
            out[name] = (exc.status_code, exc.body)
    return out


async def test_a_revoked_id_is_refused_on_every_route_and_another_works(
    nursery: trio.Nursery,
) -> None:
    log: list[str] = []
    with trio.fail_after(60):
        handle = await _start(nursery, ECHO, log)
        await handle.revoke("old")
        await handle.revoke("old")  # twice: the same
        refused = await trio.to_thread.run_sync(_every_route, handle.rollout_url("old"))
        served = await trio.to_thread.run_sync(_every_route, handle.rollout_url("new"))
        # Auth still comes first: a caller without the bearer learns nothing of the rollout.
        async with httpx.AsyncClient(timeout=20) as client:
            anonymous = await client.post(
                handle.rollout_url("old") + "/chat/completions", json={"messages": HI}
            )
    assert {name: answer[0] for name, answer in refused.items()} == dict.fromkeys(
        refused, REVOKED_STATUS
    )
    for name in ("chat", "chat stream", "responses"):
        error = refused[name][1]  # what openai-python parsed: the error object
        assert "revoked" in error["message"] and error["code"] == REVOKED_STATUS
    for name in ("messages", "count_tokens"):
        assert refused[name][1]["type"] == "error"  # Anthropic's shape
        assert "revoked" in refused[name][1]["error"]["message"]
    assert served["chat"].choices[0].message.content
    assert served["chat stream"] and served["responses"].output_text
    assert served["messages"].content[0].text and served["count_tokens"].input_tokens > 0
    assert anonymous.status_code == 401
    # Nothing counted for the refused calls, everything for the other id.
    assert handle.ledger.get("old") is None and handle.calls.get("old") == []
    usage = handle.ledger.get("new")
    assert usage is not None and usage.calls == 4  # count_tokens is not a model call
    # One log line for the five refusals.
    assert len([line for line in log if "refusing model calls" in line and "old" in line]) == 1


async def test_a_call_in_flight_is_cancelled_upstream_and_answered_410(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    provider_env.delay = 60.0
    log: list[str] = []
    with trio.fail_after(60):
        handle = await _start(nursery, "openai/test-model", log)
        replies: list[httpx.Response] = []

        async def slow_call() -> None:
            async with httpx.AsyncClient(timeout=50) as client:
                replies.append(
                    await client.post(
                        handle.rollout_url("lost") + "/chat/completions",
                        json={"messages": HI},
                        headers=AUTH,
                    )
                )

        async with trio.open_nursery() as calls:
            calls.start_soon(slow_call)
            while provider_env.in_flight == 0:
                await trio.sleep(0.01)
            await handle.revoke("lost")
            # revoke returns once the call has ended: its answer is on its way.
        while provider_env.disconnects == 0:
            await trio.sleep(0.01)  # the bridge dropped its upstream request
    (reply,) = replies
    assert reply.status_code == REVOKED_STATUS and "revoked" in reply.json()["error"]["message"]
    assert provider_env.completed == 0 and handle.ledger.get("lost") is None
    assert any("cancelled 1 model call" in line for line in log)


async def test_refused_before_the_body_is_read(start_bridge: StartBridge) -> None:
    """In process too (bridge.server.BridgeHandle): an announced body of a revoked id is left
    unread and the connection closed."""
    handle = await start_bridge(model=ECHO)
    await handle.revoke("gone")
    head = (
        f"POST /v1/rollouts/gone/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", handle.port)
        async with stream:
            await stream.send_all(head)  # and never the body
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 410")
    assert b"connection: close" in rest.lower() and b"revoked" in rest


async def test_a_stream_in_flight_is_cut_short(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    """A streamed answer has begun (the bridge's first ``: ping``) when the revocation comes:
    it ends there, and the connection with it, instead of hanging on."""
    provider_env.delay = 60.0
    with trio.fail_after(60):
        handle = await _start(nursery, "openai/test-model", [])
        target = handle.rollout_url("lost") + "/chat/completions"
        body = {"messages": HI, "stream": True}
        received: list[bytes] = []
        async with (
            httpx.AsyncClient(timeout=50) as client,
            client.stream("POST", target, json=body, headers=AUTH) as reply,
        ):
            assert reply.status_code == 200
            parts = reply.aiter_raw()
            received.append(await parts.__anext__())  # the first ping
            await handle.revoke("lost")
            with pytest.raises(httpx.RemoteProtocolError):
                async for part in parts:
                    received.append(part)
    assert b"".join(received).strip() == b": ping" and b"[DONE]" not in b"".join(received)
    assert provider_env.completed == 0 and handle.ledger.get("lost") is None


async def _chat(handle: BridgeProcessHandle, rollout_id: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=50) as client:
        return await client.post(
            handle.rollout_url(rollout_id) + "/chat/completions",
            json={"messages": HI},
            headers=AUTH,
        )


async def test_an_ended_rollout_is_refused_once_its_usage_is_taken(nursery: trio.Nursery) -> None:
    """The supervisor takes a rollout's usage for its record (``ledger.pop``: the forget goes
    to the bridge within a quarter second); from then on its calls are refused, uncounted,
    logged once, and other rollouts are served."""
    log: list[str] = []
    with trio.fail_after(60):
        handle = await _start(nursery, ECHO, log)
        assert (await _chat(handle, "done")).status_code == 200
        usage = handle.ledger.pop("done")  # as the supervisor does for the record
        assert usage is not None and usage.calls == 1 and len(handle.calls.pop("done")) == 1
        while (late := await _chat(handle, "done")).status_code == 200:
            await trio.sleep(0.05)  # the forget is on its way (batched)
            handle.ledger.pop("done")  # what was served meanwhile is not the point here
            handle.calls.pop("done")
        again = await _chat(handle, "done")
        live = await _chat(handle, "live")
    for answer in (late, again):
        assert answer.status_code == REVOKED_STATUS
        assert "rollout done has ended" in answer.json()["error"]["message"]
    assert live.status_code == 200
    assert handle.ledger.get("done") is None and handle.calls.get("done") == []
    assert len([line for line in log if "refusing model calls" in line and "done" in line]) == 1


async def test_a_call_in_flight_when_its_rollout_ends_is_cancelled(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    """A workflow that left a call running after its result: the call is cut, upstream too."""
    provider_env.delay = 60.0
    log: list[str] = []
    with trio.fail_after(60):
        handle = await _start(nursery, "openai/test-model", log)
        replies: list[httpx.Response] = []

        async def stray() -> None:
            replies.append(await _chat(handle, "ended"))

        async with trio.open_nursery() as calls:
            calls.start_soon(stray)
            while provider_env.in_flight == 0:
                await trio.sleep(0.01)
            assert handle.ledger.pop("ended") is None  # nothing finished yet
        while provider_env.disconnects == 0:
            await trio.sleep(0.01)
    (reply,) = replies
    assert reply.status_code == REVOKED_STATUS and "has ended" in reply.json()["error"]["message"]
    assert provider_env.completed == 0
    assert any("rollout ended ended: cancelled 1 model call" in line for line in log)


def test_only_the_newest_ended_ids_are_kept_and_revocations_stay() -> None:
    log: list[tuple[str, str]] = []
    ids = Revocations(lambda level, line: log.append((level, line)), keep=3)
    ids.revoke("lost")
    for rollout_id in ("a", "b", "c", "d"):
        ids.finish(rollout_id)
    ids.finish("lost")  # already refused as revoked: stays revoked
    assert "a" not in ids and all(i in ids for i in ("b", "c", "d", "lost"))
    assert len(ids) == 4
    assert "revoked" in ids.message("lost") and "has ended" in ids.message("d")
    ids.refused("d")
    ids.refused("d")
    ids.refused("lost")
    assert [line for _, line in log] == [
        f"refusing model calls: {ids.message('d')}",
        f"refusing model calls: {ids.message('lost')}",
    ]
