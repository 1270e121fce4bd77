"""The lean HTTP/1.1 loop behind LeanConfig: what a client sees on the wire, from
:func:`rollout_server.net.leanserve.serve_lean`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from rollout_server.net.leanserve import LeanConfig, serve_lean

disconnects: list[str] = []


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path == "/boom":
        raise RuntimeError("boom")
    if path == "/silent":
        return
    if path == "/watch":
        # Waits for the client to leave, as an app that watches for disconnects does.
        disconnects.append((await receive())["type"])
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    answer = b"echo:" + body + b"|" + scope["path"].encode() + b"|" + scope["query_string"]
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
def server() -> Any:
    """``serve(app, config, shutdown_trigger=...)`` of the server under test."""
    return serve_lean


@pytest.fixture
async def port(nursery: trio.Nursery, server: Any) -> AsyncIterator[int]:
    config = LeanConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.keep_alive_timeout = 0.5
    binds = await nursery.start(partial(server, _app, config))
    yield int(binds[0].rsplit(":", 1)[1])


async def _read_until(stream: trio.SocketStream, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = await stream.receive_some()
        if not chunk:
            break
        data += chunk
    return data


async def test_requests_on_one_connection_each_answer_in_one_write(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[bytes] = []
    original = trio.SocketStream.send_all

    async def recording(self: trio.SocketStream, data: Any) -> None:
        if bytes(data).startswith(b"HTTP/1.1"):
            writes.append(bytes(data))
        await original(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", recording)
    with trio.fail_after(10):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for index in range(3):
                response = await client.post(f"/a%20b?x={index}", content=b"hi")
                assert response.status_code == 200
                assert response.content == b"echo:hi|/a b|x=%d" % index
            streamed = await client.get("/stream")
            assert streamed.content == b"one two three"
    assert len(writes) == 4
    assert all(w.endswith(b"|x=%d" % i) for i, w in enumerate(writes[:3]))
    assert b"date: " in writes[0]
    assert writes[3].endswith(b"4\r\none \r\n")  # the head rides with the first chunk


async def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            b"POST /one HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nA"
            b"GET /two HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        data = await _read_until(stream, b"echo:|/two|")
        assert data.index(b"echo:A|/one|") < data.index(b"echo:|/two|")
        await stream.aclose()


async def test_expect_100_continue_and_head(port: int) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
        )
        assert (await _read_until(stream, b"\r\n\r\n")).startswith(b"HTTP/1.1 100 ")
        await stream.send_all(b"ok")
        assert (await _read_until(stream, b"echo:ok|/c|")).startswith(b"HTTP/1.1 200 ")
        await stream.send_all(b"HEAD /h HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await _read_until(stream, b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
        assert b"content-length: 9" in head  # announced, not sent
        await stream.send_all(b"GET /after HTTP/1.1\r\nhost: x\r\n\r\n")
        assert b"echo:|/after|" in await _read_until(stream, b"echo:|/after|")
        await stream.aclose()


@pytest.mark.parametrize("path", ["/boom", "/silent"])
async def test_an_app_that_fails_or_answers_nothing_gets_500(port: int, path: str) -> None:
    with trio.fail_after(10):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get(path)).status_code == 500
            assert (await client.get("/fine")).status_code == 200  # the server keeps serving


async def test_malformed_request_gets_400_and_close(port: int) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        data = await _read_until(stream, b"\x00never")
        assert data.startswith(b"HTTP/1.1 400 ")
        await stream.aclose()


async def test_an_app_waiting_for_disconnect_sees_it(port: int) -> None:
    disconnects.clear()
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /watch HTTP/1.1\r\nhost: x\r\n\r\n")
        await trio.sleep(0.1)
        await stream.aclose()
        while not disconnects:
            await trio.sleep(0.01)
    assert disconnects == ["http.disconnect"]


async def test_idle_connection_closes_after_keep_alive_timeout(port: int) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        for _ in range(3):
            await stream.send_all(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
            assert b"echo:|/x|" in await _read_until(stream, b"echo:|/x|")
        assert await stream.receive_some() == b""  # closed by the server once idle
        await stream.aclose()


async def test_idle_connection_closes_at_shutdown(server: Any) -> None:
    config = LeanConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 60.0  # an idle connection must not hold the shutdown this long
    stop = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(server, _app, config, shutdown_trigger=stop.wait))
            stream = await trio.open_tcp_stream("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
            await stream.send_all(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
            assert b"echo:|/x|" in await _read_until(stream, b"echo:|/x|")
            stop.set()
            assert await stream.receive_some() == b""
            await stream.aclose()


async def _slow_app(release: trio.Event, scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _app(scope, receive, send)
        return
    await receive()
    await release.wait()
    headers = [(b"content-length", b"4")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"done"})


async def test_a_request_in_progress_at_shutdown_is_answered_then_closed(server: Any) -> None:
    config = LeanConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 60.0
    stop, release = trio.Event(), trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            app = partial(_slow_app, release)
            binds = await nursery.start(partial(server, app, config, shutdown_trigger=stop.wait))
            port = int(binds[0].rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
            await trio.sleep(0.1)
            stop.set()
            await trio.sleep(0.1)
            with pytest.raises(OSError):  # no longer accepting
                await trio.open_tcp_stream("127.0.0.1", port)
            release.set()
            answer = await _read_until(stream, b"\x00never")  # answered, then closed
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"done")
            await stream.aclose()


async def test_a_request_outliving_the_graceful_timeout_is_cancelled(server: Any) -> None:
    config = LeanConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.2
    stop = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            app = partial(_slow_app, trio.Event())  # never released
            binds = await nursery.start(partial(server, app, config, shutdown_trigger=stop.wait))
            stream = await trio.open_tcp_stream("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
            await stream.send_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
            await trio.sleep(0.1)
            stop.set()
            assert await _read_until(stream, b"\x00never") == b""
            await stream.aclose()
