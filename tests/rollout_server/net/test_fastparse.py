"""The fast HTTP/1.1 path against h11: same events, same bytes, same decisions.

Three levels: :func:`parse_request` against h11 fed the same bytes (every verdict it gives must
be h11's), :func:`response_head`/:class:`Body` against h11 writing the same answer, and the
whole connection loop on scripted byte streams (split at random offsets, pipelined, cut short,
half-closed) served once with the fast path and once with it declining everything, so h11
serves every request as before: the app must see the same scopes and messages and the client
the same bytes.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any
from unittest import mock

import h11
import trio
from hypercorn.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_server.net import h1
from rollout_server.net.fastparse import (
    DECLINED,
    NEED_DATA,
    Body,
    Request,
    parse_request,
    response_head,
)
from rollout_server.net.h1exchange import DATE

_SETTINGS = settings(
    derandomize=True,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_PATHS = [
    b"/len",
    b"/chunk",
    b"/close",
    b"/ka",
    b"/nocontent",
    b"/bad",
    b"/short",
    b"/boom",
    b"/host",
    b"/te",
    b"/early",
    b"/str",
    b"/continue",
    b"/watch",
    b"/silent",
    b"/head",
]
_VALUE_BYTES = b"aZ09 \t,;=-\x00\x01\x7f\x80\xff\x0b\r"


@st.composite
def _requests(draw: st.DrawFn, plain: bool = False) -> bytes:
    """One request's bytes: plain ones, and (unless ``plain``) every kind of oddity."""

    def odd(weight: int) -> bool:
        return not plain and draw(st.integers(0, weight - 1)) == 0

    method = (
        b"POST"
        if plain
        else draw(
            st.sampled_from(
                [
                    b"GET",
                    b"POST",
                    b"PUT",
                    b"DELETE",
                    b"PATCH",
                    b"OPTIONS",
                    b"HEAD",
                    b"CONNECT",
                    b"get",
                    b"TRACE",
                    b"G\x01T",
                ]
            )
        )
    )
    target = draw(st.sampled_from(_PATHS)) + draw(
        st.sampled_from([b"", b"?x=1", b"%20a", b"?a=%2F&b", b"#f"])
    )
    if odd(12):
        target = draw(st.sampled_from([b"*", b"http://h/x", b"/a b", b"/\x7f", b"", b"/\x80"]))
    version = b"HTTP/1.1"
    if odd(10):
        version = draw(st.sampled_from([b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"http/1.1"]))
    eol = b"\n" if odd(15) else b"\r\n"
    body = draw(st.binary(max_size=24))
    lines = [method + b" " + target + b" " + version]
    hosts = draw(st.sampled_from([1, 1, 1, 1, 0, 2])) if not plain else 1
    fields: list[tuple[bytes, bytes]] = [(b"Host", b"example")] * hosts
    length = b"%d" % len(body)
    if odd(6):
        length = draw(
            st.sampled_from(
                [
                    length + b", " + length,
                    b"+" + length,
                    b" " + length + b" \t",
                    b"abc",
                    b"9" * 21,
                    b"0" + length,
                    b"%d" % (len(body) + 3),
                ]
            )
        )
    if body or draw(st.booleans()):
        fields.append((draw(st.sampled_from([b"Content-Length", b"content-length"])), length))
    if odd(12):
        fields.append((b"content-length", length))
    if draw(st.booleans()):
        fields.append(
            (
                b"Connection",
                draw(
                    st.sampled_from(
                        [b"keep-alive", b"close", b"Keep-Alive, Close", b"close ,", b"x, close"]
                    )
                ),
            )
        )
    if odd(10):
        fields.append(
            draw(
                st.sampled_from(
                    [
                        (b"Expect", b"100-continue"),
                        (b"Upgrade", b"websocket"),
                        (b"TE", b"trailers"),
                        (b"Transfer-Encoding", b"chunked"),
                        (b"Transfer-Encoding", b"gzip"),
                    ]
                )
            )
        )
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([b"X-Custom", b"accept", b"User-Agent", b"x_y.z"]))
        if odd(8):
            name = draw(st.sampled_from([b"Bad Name", b"x(y)", b"", b"x\x01"]))
        value = draw(st.binary(max_size=8)).translate(None, bytes(range(32)) + b"\x7f")
        if odd(4):
            value = bytes(draw(st.lists(st.sampled_from(_VALUE_BYTES), max_size=8)))
        fields.append((name, value))
    fields = draw(st.permutations(fields))
    for name, value in fields:
        spaces = draw(st.sampled_from([b"", b" ", b" \t"])) if not plain else b" "
        lines.append(name + b":" + spaces + value + (b" " if odd(5) else b""))
    if odd(15):
        lines.insert(draw(st.integers(1, len(lines))), b" folded")
    if odd(20):
        lines[0] = b"\r\n" + lines[0]
    head = eol.join(lines) + eol + eol
    if any(n.lower() == b"transfer-encoding" for n, _ in fields):
        body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    return head + body


def _h11_next(conn: h11.Connection) -> Any:
    try:
        return conn.next_event()
    except h11.RemoteProtocolError:
        return "error"


def _check_request(data: bytes, cut: int, limit: int) -> bool:
    """Compare one verdict on ``data[:cut]``; True when the fast path read a request."""
    buffer = bytearray(data[:cut])
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limit)
    conn.receive_data(data[:cut])
    if not buffer:
        return False
    verdict = parse_request(buffer, limit)
    event = _h11_next(conn)
    if verdict == DECLINED:
        return False
    if verdict == NEED_DATA:
        assert event is h11.NEED_DATA, (data[:cut], event)
        return False
    assert isinstance(verdict, Request)
    assert type(event) is h11.Request, (data[:cut], event)
    assert (verdict.method, verdict.target) == (event.method, event.target)
    assert verdict.http_version == event.http_version
    assert verdict.headers == list(event.headers)
    assert bytes(buffer) == conn.trailing_data[0]
    # The same framing and keep-alive: h11 reads exactly `length` bytes of body, then ends.
    conn.receive_data(b"\x00" * verdict.length + b"NEXT")
    received = 0
    while type(event := conn.next_event()) is h11.Data:
        received += len(event.data)
    assert type(event) is h11.EndOfMessage and received == verdict.length
    assert conn.trailing_data[0].endswith(b"NEXT")
    assert (conn.their_state is h11.DONE) == verdict.keep_alive
    return True


@_SETTINGS
@given(
    data=_requests(),
    cuts=st.lists(st.integers(0, 400), max_size=4),
    limit=st.sampled_from([16384, 40, 90]),
)
def test_every_verdict_on_a_request_is_h11s(data: bytes, cuts: list[int], limit: int) -> None:
    for cut in [len(data), *cuts]:
        _check_request(data, min(cut, len(data)), limit)


@settings(derandomize=True, deadline=None, max_examples=150)
@given(data=_requests(plain=True))
def test_plain_requests_are_read_at_every_split_and_never_declined(data: bytes) -> None:
    head = data.index(b"\r\n\r\n") + 4
    for cut in range(1, len(data) + 1):
        buffer = bytearray(data[:cut])
        verdict = parse_request(buffer, 16384)
        assert verdict != DECLINED
        assert (verdict == NEED_DATA) == (cut < head)
        _check_request(data, cut, 16384)


_NAMES = [
    b"Content-Type",
    b"content-length",
    b"Content-Length",
    b"connection",
    b"Connection",
    b"Host",
    b"transfer-encoding",
    b"X-A",
    b"set-cookie",
    b"Bad Name",
    "x-str",
]


@st.composite
def _answers(draw: st.DrawFn) -> tuple[int, list[Any], list[bytes], bool]:
    status = draw(st.sampled_from([200, 200, 201, 404, 500, 999, 100, 204, 304, 1000, 199]))
    pieces = draw(st.lists(st.binary(max_size=6), max_size=3))
    total = sum(map(len, pieces))
    headers: list[Any] = []
    for name in draw(st.lists(st.sampled_from(_NAMES), max_size=5)):
        if isinstance(name, bytes) and name.lower() == b"content-length":
            value = draw(
                st.sampled_from(
                    [
                        b"%d" % total,
                        b"%d" % total,
                        b"%d" % (total + 1),
                        b"x",
                        b"%d, %d" % (total, total),
                    ]
                )
            )
        elif isinstance(name, bytes) and name.lower() == b"connection":
            value = draw(st.sampled_from([b"close", b"keep-alive", b"Upgrade, Close"]))
        else:
            value = bytes(draw(st.lists(st.sampled_from(_VALUE_BYTES), max_size=6)))
        headers.append((name, value))
    return status, headers, pieces, draw(st.booleans())


def _h11_answer(status: int, headers: list[Any], pieces: list[bytes], keep: bool) -> list[Any]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(
        b"GET / HTTP/1.1\r\nHost: x\r\n" + (b"" if keep else b"Connection: close\r\n") + b"\r\n"
    )
    conn.next_event()
    steps: list[Any] = []
    try:
        steps.append(conn.send(h11.Response(status_code=status, headers=headers)))
        for piece in pieces:
            if piece:
                steps.append(conn.send(h11.Data(data=piece)))
        steps.append(conn.send(h11.EndOfMessage()))
    except h11.LocalProtocolError:
        steps.append("error")
        return steps
    return [*steps, conn.our_state is h11.DONE]


@_SETTINGS
@given(answer=_answers())
def test_a_plain_answer_is_written_as_h11_writes_it(answer: Any) -> None:
    status, headers, pieces, keep = answer
    expected = _h11_answer(status, headers, pieces, keep)
    head = response_head(status, headers, keep)
    if head is None:
        return
    data, length, stays = head
    steps: list[Any] = [data]
    body = Body(length)
    try:
        steps.extend(body.data(piece) for piece in pieces if piece)
        steps.append(body.end())
    except h11.LocalProtocolError:
        steps.append("error")
    else:
        steps.append(stays)
    assert steps == expected


def test_the_usual_answers_take_the_fast_path() -> None:
    for keep in (True, False):
        for headers in (
            [(b"content-type", b"application/json"), (b"content-length", b"2")],
            [(b"content-type", b"text/event-stream"), (b"cache-control", b"no")],
            [(b"content-length", b"0"), (b"connection", b"close")],
        ):
            if keep or headers[-1][0] != b"connection":
                assert response_head(200, headers, keep) is not None


# -- the whole loop: fast path on, and declining everything (h11 serves, as before) --


class _Script:
    """A client: sends ``chunks`` one per read, then ends (EOF) or vanishes (broken)."""

    def __init__(self, chunks: list[bytes], end: str) -> None:
        self.chunks = list(chunks)
        self.end = end
        self.out: list[bytes] = []

    async def receive_some(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.chunks:
            return self.chunks.pop(0)
        if self.end == "eof":
            return b""
        raise trio.BrokenResourceError

    async def send_all(self, data: Any) -> None:
        await trio.lowlevel.checkpoint()
        self.out.append(bytes(data))


async def _app(log: list[Any], scope: Any, receive: Any, send: Any, *_: Any) -> None:
    log.append(
        (
            scope["method"],
            scope["path"],
            scope["raw_path"],
            scope["query_string"],
            scope["http_version"],
            scope["headers"],
        )
    )
    path = scope["path"]
    body = b""
    if path not in ("/early", "/silent"):
        while True:
            message = await receive()
            log.append(message)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
    if path == "/watch":
        log.append(await receive())
    if path == "/boom":
        raise RuntimeError("boom")
    if path == "/silent":
        return
    answers: dict[str, tuple[int, list[Any], list[bytes]]] = {
        "/chunk": (200, [(b"content-type", b"text/plain")], [b"one", b"", b"two"]),
        "/close": (
            200,
            [(b"Content-Length", b"%d" % len(body)), (b"Connection", b"close")],
            [body],
        ),
        "/ka": (200, [(b"content-length", b"2"), (b"connection", b"keep-alive")], [b"ka"]),
        "/nocontent": (204, [], [b"dropped"]),
        "/bad": (200, [(b"x-bad", b"a\x00b")], [b"x"]),
        "/short": (200, [(b"content-length", b"10")], [b"abc"]),
        "/host": (200, [(b"x-a", b"1"), (b"Host", b"h"), (b"content-length", b"1")], [b"h"]),
        "/te": (200, [(b"Transfer-Encoding", b"chunked")], [b"te"]),
        "/str": (200, [("content-length", "3")], [b"str"]),
        "/continue": (100, [], [b""]),
    }
    status, headers, pieces = answers.get(
        path, (201, [(b"content-length", b"%d" % (len(body) + 1))], [body, b"!"])
    )
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for index, piece in enumerate(pieces):
            more = index < len(pieces) - 1
            await send({"type": "http.response.body", "body": piece, "more_body": more})
    except h11.LocalProtocolError:
        log.append("LocalProtocolError")
        raise


def _serve(chunks: list[bytes], end: str, limit: int, max_requests: int) -> Any:
    config = Config()
    config.errorlog = None
    config.h11_max_incomplete_size = limit
    config.keep_alive_max_requests = max_requests
    log: list[Any] = []
    script = _Script(chunks, end)

    async def idle() -> None:
        log.append("idle")

    async def busy() -> None:
        log.append("busy")

    async def main() -> None:
        with trio.fail_after(10):
            connection = h1._Connection(config, script, idle, busy)  # type: ignore[arg-type]
            await connection.serve(lambda *a: _app(log, *a), None, None, {})

    trio.run(main)
    return log, b"".join(script.out)


def _compare(chunks: list[bytes], end: str, limit: int = 16384, max_requests: int = 1000) -> Any:
    fast = _serve(chunks, end, limit, max_requests)
    with mock.patch.object(h1, "parse_request", lambda buffer, limit: DECLINED):
        slow = _serve(chunks, end, limit, max_requests)
    assert fast == slow
    return fast


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(min(cut, len(data)) for cut in cuts)})
    return [data[a:b] for a, b in pairwise(edges) if b > a]


_DATE_VALUE = (b"date", b"Thu, 01 Jan 1970 00:00:00 GMT")


@settings(
    derandomize=True,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    requests=st.lists(_requests(), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 600), max_size=6),
    end=st.sampled_from(["eof", "broken"]),
    limit=st.sampled_from([16384, 16384, 60]),
    max_requests=st.sampled_from([1000, 2]),
)
def test_the_loop_serves_any_stream_as_h11_alone_does(
    requests: list[bytes], cuts: list[int], end: str, limit: int, max_requests: int
) -> None:
    with mock.patch.object(type(DATE), "header", lambda self: _DATE_VALUE):
        _compare(_split(b"".join(requests), cuts), end, limit, max_requests)


def test_pipelined_plain_requests_split_at_every_offset() -> None:
    stream = (
        b"POST /len?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /chunk HTTP/1.1\r\nhost: x\r\n\r\n"
        b"GET /close HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    with mock.patch.object(type(DATE), "header", lambda self: _DATE_VALUE):
        for offset in range(len(stream) + 1):
            for end in ("eof", "broken"):
                _, out = _compare(_split(stream, [offset]), end)
                assert out.count(b"HTTP/1.1 ") == 3, (offset, out)


def test_the_fast_path_answers_plain_requests_without_h11() -> None:
    stream = [
        b"POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /chunk HTT",
        b"P/1.1\r\nHost: x\r\n\r\n",
    ]
    with mock.patch.object(h1.h11, "Connection", side_effect=AssertionError("h11 used")):
        log, out = _serve(stream, "eof", 16384, 1000)
    assert out.startswith(b"HTTP/1.1 201 \r\ncontent-length: 3\r\ndate: ")
    assert out.endswith(
        b"\r\n\r\nhi!HTTP/1.1 200 \r\ncontent-type: text/plain\r\ndate: "
        + out.rsplit(b"date: ", 1)[1].split(b"\r\n")[0]
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
    )
    assert log[3:5] == [
        {"type": "http.request", "body": b"hi", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": False},
    ]
