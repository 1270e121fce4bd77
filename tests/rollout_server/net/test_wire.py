"""The lean HTTP/1.1 client (rollout_server/net/wire.py): reuse, stale connections, compressed
and streamed answers, resumed reads, TLS, and how far a failed exchange got."""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import struct
import subprocess
import zlib
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import h11
import pytest
import trio

from rollout_server.net import httpclient
from rollout_server.net.wire import (
    ConnectFailed,
    ConnectionLost,
    ConnectTimeout,
    NotSent,
    Origin,
    ReadTimeout,
    WireError,
    WirePool,
)

Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def _serve(nursery: trio.Nursery, handler: Handler) -> int:
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


async def _read_request(stream: trio.abc.Stream, conn: h11.Connection) -> bool:
    """Read one whole request on ``conn``; False when the client closed the connection."""
    while type(event := conn.next_event()) is not h11.EndOfMessage:
        if type(event) is h11.ConnectionClosed:
            return False
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
    return True


def _answer(conn: h11.Connection, body: bytes, *headers: tuple[bytes, bytes]) -> bytes:
    head = [*headers, (b"content-length", b"%d" % len(body))]
    return (
        (conn.send(h11.Response(status_code=200, headers=head)) or b"")
        + (conn.send(h11.Data(data=body)) or b"")
        + (conn.send(h11.EndOfMessage()) or b"")
    )


async def test_reuses_connections_and_replaces_one_the_server_closed(
    nursery: trio.Nursery,
) -> None:
    """Two requests per connection, then the server closes it while idle: every call still
    succeeds, on two connections, and gzip answers arrive decoded."""
    opened = 0
    closed = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal opened
        opened += 1
        conn = h11.Connection(h11.SERVER)
        for served in range(2):
            if not await _read_request(stream, conn):
                return
            body = gzip.compress(json.dumps({"n": served}).encode())
            await stream.send_all(_answer(conn, body, (b"content-encoding", b"gzip")))
            conn.start_next_cycle()
        await stream.aclose()
        closed.set()

    port = await _serve(nursery, handler)
    origin = Origin.parse(f"http://127.0.0.1:{port}/v1/chat/completions")
    pool = WirePool(connect_timeout=10, timeout=10)
    answers = []
    with trio.fail_after(20):
        for i in range(3):
            if i == 2:
                await closed.wait()
            response = await pool.request(origin, [(b"content-type", b"application/json")], b"{}")
            assert response.status == 200
            answers.append(json.loads(await response.read()))
            await response.aclose()
        await pool.aclose()
    assert answers == [{"n": 0}, {"n": 1}, {"n": 0}]
    assert opened == 2


async def test_streamed_deflate_answer_and_per_call_method(nursery: trio.Nursery) -> None:
    """A chunked deflate body arrives decoded piece by piece; ``send`` takes the method and
    target of the call, and a bodiless GET carries no content-length."""
    seen: list[tuple[bytes, bytes, bool]] = []
    release = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        request = None
        while type(event := conn.next_event()) is not h11.EndOfMessage:
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif type(event) is h11.Request:
                request = event
        assert request is not None
        names = [name for name, _ in request.headers]
        seen.append((request.method, request.target, b"content-length" in names))
        packed = zlib.compress(b"hello, " * 100 + b"world")
        head = [(b"content-encoding", b"deflate"), (b"transfer-encoding", b"chunked")]
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=head)) or b"")
        await stream.send_all(conn.send(h11.Data(data=packed[:10])) or b"")
        await release.wait()
        await stream.send_all(
            (conn.send(h11.Data(data=packed[10:])) or b"") + (conn.send(h11.EndOfMessage()) or b"")
        )

    port = await _serve(nursery, handler)
    origin = Origin("http", "127.0.0.1", port)
    pool = WirePool(connect_timeout=10, timeout=10)
    with trio.fail_after(20):
        connection = pool.idle(origin) or await pool.connect(origin, 10)
        response = await pool.send(connection, origin, b"GET", b"/x?y=1", [], b"")
        assert response.headers["content-encoding"] == "deflate"
        pieces = []
        async for piece in response.chunks():
            pieces.append(piece)
            release.set()
        await pool.aclose()
    assert seen == [(b"GET", b"/x?y=1", False)]
    assert b"".join(pieces) == b"hello, " * 100 + b"world"


async def test_a_cancelled_read_resumes(nursery: trio.Nursery) -> None:
    """``read`` cancelled while the body is arriving loses nothing: called again, it returns
    the whole body."""
    release = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        await _read_request(stream, conn)
        head = [(b"content-length", b"6")]
        await stream.send_all(
            (conn.send(h11.Response(status_code=200, headers=head)) or b"")
            + (conn.send(h11.Data(data=b"abc")) or b"")
        )
        await release.wait()
        await stream.send_all(
            (conn.send(h11.Data(data=b"def")) or b"") + (conn.send(h11.EndOfMessage()) or b"")
        )

    port = await _serve(nursery, handler)
    origin = Origin.parse(f"http://127.0.0.1:{port}/")
    pool = WirePool(connect_timeout=10, timeout=10)
    with trio.fail_after(20):
        response = await pool.request(origin, [], b"{}")
        with trio.move_on_after(0.2) as first:
            await response.read()
        assert first.cancelled_caught
        release.set()
        assert await response.read() == b"abcdef"
        await response.aclose()
        await pool.aclose()


def _reset(stream: trio.SocketStream) -> None:
    """Close ``stream``'s socket with a TCP reset instead of a FIN."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def test_failures_say_whether_the_request_left(nursery: trio.Nursery) -> None:
    """Only a failure to connect is :class:`NotSent`; a connection reset or closed after the
    request was written, or a silent server, is not, whatever the phase."""

    async def reset_after_request(stream: trio.SocketStream) -> None:
        await _read_request(stream, h11.Connection(h11.SERVER))
        _reset(stream)

    async def close_after_request(stream: trio.SocketStream) -> None:
        await _read_request(stream, h11.Connection(h11.SERVER))
        await stream.aclose()

    async def close_mid_body(stream: trio.SocketStream) -> None:
        await _read_request(stream, h11.Connection(h11.SERVER))
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await stream.aclose()

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    pool = WirePool(connect_timeout=10, timeout=0.3)

    async def fail(port: int) -> WireError:
        origin = Origin("http", "127.0.0.1", port)
        with pytest.raises(WireError) as caught:
            response = await pool.request(origin, [], b"{}")
            await response.read()
        return caught.value

    with trio.fail_after(20):
        refused = await fail(closed_port)
        reset = await fail(await _serve(nursery, reset_after_request))
        hung_up = await fail(await _serve(nursery, close_after_request))
        cut = await fail(await _serve(nursery, close_mid_body))
        slow = await fail(await _serve(nursery, silent))
    assert isinstance(refused, ConnectFailed) and isinstance(refused, NotSent)
    assert refused.before_answer
    for error in (reset, hung_up, cut):
        assert isinstance(error, ConnectionLost) and not isinstance(error, NotSent)
    assert reset.before_answer and hung_up.before_answer and not cut.before_answer
    assert "Server disconnected without sending a response" in str(hung_up)
    assert isinstance(slow, ReadTimeout) and slow.before_answer and not isinstance(slow, NotSent)


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n"],
    ids=["lean", "h11"],
)
async def test_timeout_bounds_each_read_not_the_whole_answer(
    nursery: trio.Nursery, head: bytes
) -> None:
    """The timeout is between reads: an answer whose pieces come 0.4 s apart arrives whole
    under a 1 s bound although it takes longer than that (its head too, read by h11 when it is
    not the simple kind)."""

    async def trickle(stream: trio.SocketStream) -> None:
        await _read_request(stream, h11.Connection(h11.SERVER))
        pieces = [head[:4], head[4:8], head[8:12], head[12:], b"o", b"k"]
        for piece in pieces:
            await stream.send_all(piece)
            await trio.sleep(0.4)
        await stream.aclose()

    pool = WirePool(connect_timeout=10, timeout=1.0)
    origin = Origin("http", "127.0.0.1", await _serve(nursery, trickle))
    with trio.fail_after(20):
        start = trio.current_time()
        response = await pool.request(origin, [], b"{}")
        assert await response.read() == b"ok"
        assert trio.current_time() - start > 1.0
        await pool.aclose()


async def test_content_encoding_unknown_or_left_alone(nursery: trio.Nursery) -> None:
    """An answer in a coding the client cannot decode fails; with ``decompress=False`` every
    body arrives as sent."""

    async def handler(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while await _read_request(stream, conn):
            packed = gzip.compress(b"raw")
            await stream.send_all(_answer(conn, packed, (b"content-encoding", b"br")))
            conn.start_next_cycle()

    origin = Origin("http", "127.0.0.1", await _serve(nursery, handler))
    with trio.fail_after(20):
        decoding = WirePool(connect_timeout=10, timeout=10)
        with pytest.raises(ConnectionLost, match="unsupported content-encoding 'br'"):
            await decoding.request(origin, [], b"")
        await decoding.aclose()
        raw = WirePool(decompress=False)
        response = await raw.request(origin, [], b"")
        assert await response.read() == gzip.compress(b"raw")
        await raw.aclose()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl's CLI), and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = [
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", str(key), "-out", str(cert),
    ]  # fmt: skip
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a test certificate with openssl: {exc}")
    return cert, key


async def test_https_reuses_one_tls_connection_and_verifies_the_server(
    nursery: trio.Nursery, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTPS two calls share one verified TLS connection; a server the process's TLS
    context does not trust fails to connect (never sent)."""
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    opened = 0

    async def handler(raw: trio.SocketStream) -> None:
        nonlocal opened
        opened += 1
        stream = trio.SSLStream(raw, server_tls, server_side=True)
        conn = h11.Connection(h11.SERVER)
        try:
            while await _read_request(stream, conn):
                await stream.send_all(_answer(conn, b"secure"))
                conn.start_next_cycle()
        except trio.BrokenResourceError:
            return

    origin = Origin.parse(f"https://127.0.0.1:{await _serve(nursery, handler)}/v1")
    assert origin.host_header == b"127.0.0.1:%d" % origin.port
    with trio.fail_after(20):
        untrusting = WirePool(connect_timeout=10, timeout=10)
        with pytest.raises(ConnectFailed):
            await untrusting.request(origin, [], b"{}")
        trusting = ssl.create_default_context(cafile=str(cert))
        monkeypatch.setattr(httpclient, "shared_tls", lambda: trusting)
        pool = WirePool(connect_timeout=10, timeout=10)
        bodies = []
        for _ in range(2):
            response = await pool.request(origin, [], b"{}")
            bodies.append(await response.read())
        await pool.aclose()
    assert bodies == [b"secure", b"secure"]
    assert opened == 2  # the refused handshake, then one connection for both calls


async def test_numeric_hosts_connect_without_the_resolver(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An IP literal (every loopback hop of a run) connects with one ``connect`` call, IPv4 or
    IPv6; a host name still goes through ``trio.open_tcp_stream``; the connect timeout holds on
    both paths."""
    assert Origin("http", "127.0.0.1", 1).address == (socket.AF_INET, ("127.0.0.1", 1))
    assert Origin("http", "::1", 2).address == (socket.AF_INET6, ("::1", 2))
    assert Origin.parse("http://[::1]:3/v1").address == (socket.AF_INET6, ("::1", 3))
    assert Origin("http", "localhost", 4).address is None
    assert Origin("https", "api.example.invalid", 443).address is None

    by_name: list[tuple[str, int]] = []

    async def resolver_path(host: str, port: int) -> trio.SocketStream:
        by_name.append((host, port))
        raise OSError("name lookups are not for this test")

    monkeypatch.setattr(trio, "open_tcp_stream", resolver_path)

    async def ok(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while await _read_request(stream, conn):
            await stream.send_all(_answer(conn, b"{}"))
            conn.start_next_cycle()

    port = await _serve(nursery, ok)
    pool = WirePool(connect_timeout=10, timeout=10)
    with trio.fail_after(20):
        response = await pool.request(Origin("http", "127.0.0.1", port), [], b"{}")
        assert response.status == 200 and await response.read() == b"{}"
        with pytest.raises(ConnectFailed, match="name lookups"):
            await pool.request(Origin("http", "localhost", port), [], b"{}")
        assert by_name == [("localhost", port)]

        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            pass  # no IPv6 loopback here: the IPv4 case above is the one that counts
        else:
            v6 = await nursery.start(partial(trio.serve_tcp, ok, 0, host="::1"))
            v6_port = v6[0].socket.getsockname()[1]
            response = await pool.request(Origin.parse(f"http://[::1]:{v6_port}/"), [], b"{}")
            assert response.status == 200 and await response.read() == b"{}"

        timed_out = WirePool(connect_timeout=0, timeout=10)
        with pytest.raises(ConnectTimeout):
            await timed_out.request(Origin("http", "127.0.0.1", port), [], b"{}")
    await pool.aclose()
