"""The bridge in its own process (bridge.process, bridge.child): a real child, real sockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from typing import Any

import httpx
import psutil
import pytest
import trio
import trio.testing

from bridge.channel import _FORGET_BATCH, Channel
from bridge.errors import BridgeBindError
from bridge.process import BridgeProcessHandle, run_bridge_process
from bridge.server import BridgeConfig
from bridge.spare import IN_PROCESS_ENV, BridgeSpare
from tests.bridge.conftest import AUTH, HI, TOKEN, url
from tests.fakes.upstream import FakeUpstream

SECRET = "sk-run-secret-value-0123456789abcdef"


def _config(**overrides: Any) -> BridgeConfig:
    fields: dict[str, Any] = {"model": "openai/test-model", "token": TOKEN}
    fields.update(overrides)
    return BridgeConfig(**fields)


async def _start(nursery: trio.Nursery, **kwargs: Any) -> BridgeProcessHandle:
    spare = kwargs.pop("spare", None)
    values = kwargs.pop("redact_values", (TOKEN,))
    handle: BridgeProcessHandle = await nursery.start(
        lambda task_status: run_bridge_process(
            _config(**kwargs), spare=spare, redact_values=values, task_status=task_status
        )
    )
    return handle


async def _gone(pid: int) -> None:
    """Wait until ``pid`` is no longer a live process (a zombie counts as gone)."""
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        await trio.sleep(0.02)


async def test_usage_is_known_as_soon_as_each_answer_arrives(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    with trio.fail_after(60):
        handle = await _start(nursery)
        assert handle.pid is not None and handle.pid != os.getpid()
        seen: dict[str, int] = {}

        async def one(client: httpx.AsyncClient, rid: str) -> None:
            reply = await client.post(url(handle, rid), json={"messages": HI}, headers=AUTH)
            assert reply.status_code == 200
            usage = handle.ledger.pop(rid)  # no wait: it must already be here
            assert usage is not None
            seen[rid] = usage.calls

        async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as calls:
            for i in range(60):
                calls.start_soon(one, client, f"r{i}")
        assert seen == {f"r{i}": 1 for i in range(60)}
        assert handle.ledger.pressure().answered == 60
        assert handle.ledger.snapshot() == {}


async def test_faults_and_retries_cross_the_hop(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    provider_env.fail_statuses.extend([429])
    provider_env.retry_after = "0"
    with trio.fail_after(60):
        handle = await _start(nursery)
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(url(handle, "r1"), json={"messages": HI}, headers=AUTH)
        assert reply.status_code == 200
        usage = handle.ledger.pop("r1")
        assert usage is not None and usage.calls == 1 and usage.retries == 1
        assert handle.ledger.pressure().rate_limited == 1


async def test_keepalive_switch_reaches_the_child(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    provider_env.delay = 0.3
    with trio.fail_after(60):
        handle = await _start(nursery, keepalive_grace=0.01, keepalive_interval=0.01)
        async with httpx.AsyncClient(timeout=30) as client:
            off = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
            handle.keepalive = True
            assert handle.keepalive
            await handle.settled()
            on = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
        assert not off.content.startswith(b" ")
        assert on.content.startswith(b" ")
        assert json.loads(on.content)["choices"][0]["message"]["content"]


async def test_secrets_are_masked_in_answers_and_logs(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    provider_env.fail_statuses.extend([400])
    provider_env.fail_body = json.dumps({"error": {"message": f"key {SECRET} is not valid"}})
    lines: list[str] = []
    with trio.fail_after(60):
        handle = await _start(
            nursery,
            redact_values=(TOKEN, SECRET),
            log=lambda level, message: lines.append(message),
        )
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
        handle.ledger.snapshot()  # drains the socket: the child's log lines with it
    assert reply.status_code == 400
    assert SECRET not in reply.text and "REDACTED" in reply.text
    assert lines and not any(SECRET in line for line in lines)
    assert any("listening" in line for line in lines)


async def test_a_taken_port_is_a_bind_error(
    nursery: trio.Nursery, provider_env: FakeUpstream
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with trio.fail_after(60), pytest.raises(BridgeBindError, match="could not bind"):
            await _start(nursery, port=taken.getsockname()[1])
    finally:
        taken.close()


async def test_a_dead_child_is_reported_and_a_stop_leaves_none(provider_env: FakeUpstream) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handle = await _start(nursery)
            os.kill(handle.pid or 0, signal.SIGKILL)
            reason = await handle.wait_failed()
            nursery.cancel_scope.cancel()
        assert reason == "the LLM bridge process was killed by signal 9"

        async with trio.open_nursery() as nursery:
            handle = await _start(nursery)
            pid = handle.pid or 0
            nursery.cancel_scope.cancel()
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


async def test_a_spare_takes_the_environment_of_its_start(
    nursery: trio.Nursery, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    spare = BridgeSpare.spawn()  # before the provider's settings exist
    monkeypatch.setenv("OPENAI_BASE_URL", fake_upstream.v1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    with trio.fail_after(60):
        handle = await _start(nursery, spare=spare)
        assert handle.pid == spare.process.pid
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
        assert reply.status_code == 200
        assert len(fake_upstream.requests) == 1


def test_an_unused_spare_stops_at_once() -> None:
    spare = BridgeSpare.spawn()
    spare.discard()
    assert spare.process.returncode is not None
    spare.discard()  # twice is fine


_SUPERVISOR = textwrap.dedent(
    """
    import sys, trio
    from bridge.process import run_bridge_process
    from bridge.server import BridgeConfig

    async def main():
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(
                run_bridge_process, BridgeConfig(model="rollbridge/echo", token="t" * 20)
            )
            print(handle.pid, flush=True)
            await trio.sleep_forever()

    trio.run(main)
    """
)


async def test_the_child_does_not_outlive_a_killed_supervisor() -> None:
    with trio.fail_after(60):
        supervisor = await trio.lowlevel.open_process(
            [sys.executable, "-c", _SUPERVISOR], stdout=subprocess.PIPE
        )
        try:
            assert supervisor.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await supervisor.stdout.receive_some()
            child = int(line)
            assert psutil.pid_exists(child)
            supervisor.kill()  # SIGKILL: nothing of the supervisor runs after this
            await supervisor.wait()
            await _gone(child)
        finally:
            if supervisor.returncode is None:
                supervisor.kill()
                await supervisor.wait()


def test_the_spare_started_ahead_is_the_one_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IN_PROCESS_ENV, "1")
    assert BridgeSpare.ahead() is None  # the bridge will run in process: no child at all
    monkeypatch.delenv(IN_PROCESS_ENV)
    ahead = BridgeSpare.ahead()
    assert ahead is not None
    try:
        taken = BridgeSpare.take()
        assert taken is ahead and taken.taken
        other = BridgeSpare.take()  # used once: the next bridge gets a new one
        assert other is not ahead
        other.taken = False
        other.discard()
    finally:
        ahead.taken = False
        ahead.discard()


def _lines(sock: socket.socket) -> list[list[Any]]:
    """Every message waiting on ``sock`` (never blocks)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


async def test_forgets_are_batched_and_urgent_messages_are_not() -> None:
    ours, child = socket.socketpair()
    ours.setblocking(False)
    child.setblocking(False)
    with ours, child, trio.fail_after(30):
        channel = Channel(ours, None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.flush)
            assert channel.ledger.pop("r1") is None
            channel.ledger.discard("r2")
            channel.send(["k", True])
            # The forgets wait; the keepalive switch went out at once, ahead of them.
            assert _lines(child) == [["k", True]]
            while not (got := _lines(child)):
                await trio.sleep(0.01)
            assert got == [["x", "r1"], ["x", "r2"]]  # one write, both lines
            # A full batch goes out in the call that fills it, without waiting.
            for i in range(_FORGET_BATCH):
                channel.ledger.pop(f"b{i}")
            assert _lines(child) == [["x", f"b{i}"] for i in range(_FORGET_BATCH)]
            # And a pop still drains first: usage the child sent is read before the answer.
            child.send(b'["u","r3",1,2,3,0,0]\n')
            usage = channel.ledger.pop("r3")
            assert usage is not None and usage.total_tokens == 3
            nursery.cancel_scope.cancel()


async def test_the_childs_stderr_is_redacted_before_it_is_logged() -> None:
    from collections import deque

    from bridge.process import _pump_stderr
    from bridge.scrub import ErrorScrubber

    redact = ErrorScrubber([TOKEN], extra=lambda text: text.replace(SECRET, "[gone]")).scrub
    send, receive = trio.testing.memory_stream_pair()
    lines: list[str] = []
    tail: deque[str] = deque(maxlen=5)
    done = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                _pump_stderr, receive, tail, lambda _, line: lines.append(line), redact, done
            )
            await send.send_all(
                f"Traceback: token={TOKEN}\nkey {SECRET}\npartial {SECRET}".encode()
            )
            await send.aclose()
    assert done.is_set()
    assert len(lines) == 2 and all(line.startswith("bridge process: ") for line in lines)
    assert not any(TOKEN in line or SECRET in line for line in [*lines, *tail])
    assert [line.split()[0] for line in tail] == ["Traceback:", "key", "partial"]


async def test_an_environment_value_that_is_not_utf8_crosses_as_bytes(
    nursery: trio.Nursery, provider_env: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLBRIDGE_TEST_LATIN1", "caf\udce9")  # the bytes b"caf\xe9"
    with trio.fail_after(60):
        handle = await _start(nursery, redact_values=(TOKEN, "caf\udce9"))
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(url(handle), json={"messages": HI}, headers=AUTH)
    assert reply.status_code == 200


async def test_cache_write_tokens_cross_the_process_boundary() -> None:
    from bridge.child import _Reporter
    from bridge.usage import CallUsage

    ours, child = socket.socketpair()
    ours.setblocking(False)
    with ours, child, trio.fail_after(10):
        channel = Channel(ours, None)
        _Reporter(child).recorded("r", CallUsage(100, 5, 105, 60, None, 30))
        await trio.lowlevel.checkpoint()
        usage = channel.ledger.pop("r")
    assert usage is not None
    assert (usage.prompt_tokens, usage.cached_tokens, usage.cache_write_tokens) == (100, 60, 30)


def test_ray_s_variables_do_not_reach_the_bridge_s_process() -> None:
    """Under ``--ray`` the supervisor's environment holds the cluster's token; the bridge's
    process (the one behind the tunnel) is given everything else of it, bytes as they are."""
    from bridge.ipc import config_message, read_config

    environ = {b"RAY_AUTH_TOKEN": b"t" * 64, b"RAY_ADDRESS": b"10.0.0.1:6379", b"X": b"\xff"}
    message = config_message(BridgeConfig(model="rollbridge/echo", token="t" * 20), (), environ)
    _, _, crossed = read_config(message[1])
    assert crossed == [(b"X", b"\xff")]
