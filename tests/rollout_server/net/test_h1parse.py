"""httptools as the lean server's one parser, held against h11 (the differential corpus).

A generated stream of one to three requests (plain ones and every kind of oddity: methods,
targets, versions, bare LF, folding, repeated or odd lengths, chunked and other codings,
control bytes), cut at random offsets, is served by the lean loop and parsed by h11 alone.
The loop must never split the stream into requests differently from h11: the requests its
app sees are a prefix of h11's (same method, target, headers and body), and where it stops
short it has answered 4xx, never 5xx. A fixed corpus of malformed framing checks each case
gets its 4xx.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any

import h11
import pytest
import trio
from hypercorn.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_server.net import h1
from rollout_server.net.limits import MAX_HEAD, MAX_HEADERS

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


class _Script:
    """A client: sends ``chunks`` one per read, then ends (EOF)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.out: list[bytes] = []

    async def receive_some(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.chunks.pop(0) if self.chunks else b""

    async def send_all(self, data: Any) -> None:
        await trio.lowlevel.checkpoint()
        self.out.append(bytes(data))


def _serve(chunks: list[bytes]) -> tuple[list[Any], bytes]:
    """The requests the loop's app saw, and the bytes the client got."""
    config = Config()
    config.errorlog = None
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any, *_: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message["body"]
            if not message["more_body"]:
                break
        method = scope["method"].encode()
        target = scope["raw_path"] + (
            b"?" + scope["query_string"] if scope["query_string"] else b""
        )
        seen.append((method, target, scope["headers"], body))
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    async def nothing() -> None:
        pass

    async def main() -> None:
        with trio.fail_after(10):
            connection = h1._Connection(config, script, nothing, nothing)  # type: ignore[arg-type]
            await connection.serve(app, None, None, {})

    script = _Script(chunks)
    trio.run(main)
    return seen, b"".join(script.out)


def _h11_requests(data: bytes) -> tuple[list[Any], bool]:
    """The requests h11 alone reads from ``data`` (answering each 200), and whether it
    stopped on an error.

    Empty lines before a request line are skipped first, as RFC 9112, section 2.2, asks of a server
    and llhttp does (h11 refuses them): a fresh h11 connection reads each request."""
    requests: list[Any] = []
    while True:
        data = data.lstrip(b"\r\n")
        if not data:
            return requests, False
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(data)
        conn.receive_data(b"")
        try:
            event = conn.next_event()
            if type(event) is not h11.Request:
                return requests, False
            body = b""
            while type(part := conn.next_event()) is h11.Data:
                body += part.data
            if type(part) is not h11.EndOfMessage:
                return requests, False  # the stream ended inside the body
        except h11.RemoteProtocolError:
            return requests, True
        requests.append((event.method, event.target, list(event.headers), body))
        if event.method == b"CONNECT":
            return requests, False  # a 200 switches protocols: no more HTTP on it
        conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"2")]))
        if event.method != b"HEAD":
            conn.send(h11.Data(data=b"ok"))
        conn.send(h11.EndOfMessage())
        if conn.our_state is not h11.DONE:
            return requests, False
        conn.start_next_cycle()
        data = conn.trailing_data[0]


def _statuses(out: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 ([0-9]{3}) \r\n", out)]


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(min(cut, len(data)) for cut in cuts)})
    return [data[a:b] for a, b in pairwise(edges) if b > a]


def _check(data: bytes, cuts: list[int]) -> list[Any]:
    seen, out = _serve(_split(data, cuts))
    expected, _ = _h11_requests(data)
    assert seen == expected[: len(seen)], (data, seen, expected)
    statuses = _statuses(out)
    # 505: an HTTP/2.0 request line, which h11 serves as 1.x (RFC 9112, section 2.3).
    assert all(status < 500 or status == 505 for status in statuses), (data, out)
    if len(seen) < len(expected):
        # Stopped short of h11: refused with a 4xx (h11 read something llhttp does not).
        assert statuses and (400 <= statuses[-1] < 500 or statuses[-1] == 505), (data, out)
    return seen


@settings(
    derandomize=True,
    deadline=None,
    max_examples=500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    requests=st.lists(_requests(), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 600), max_size=6),
)
def test_requests_are_split_as_h11_splits_them(requests: list[bytes], cuts: list[int]) -> None:
    _check(b"".join(requests), cuts)


@settings(derandomize=True, deadline=None, max_examples=150)
@given(requests=st.lists(_requests(plain=True), min_size=1, max_size=3))
def test_plain_requests_are_all_served_at_every_split(requests: list[bytes]) -> None:
    data = b"".join(requests)
    expected, _ = _h11_requests(data)
    for cut in range(0, len(data) + 1, 7):
        assert len(_check(data, [cut])) == len(expected)


_HEAD = b"POST / HTTP/1.1\r\nHost: x\r\n"
_CHUNKED = _HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
MALFORMED = {
    "overlong chunk size": _CHUNKED + b"f" * 40 + b"\r\nhello\r\n0\r\n\r\n",
    "0x chunk size": _CHUNKED + b"0x5\r\nhello\r\n0\r\n\r\n",
    "bare LF chunk line": _CHUNKED + b"5\nhello\r\n0\r\n\r\n",
    "negative chunk size": _CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n",
    "chunk without its CRLF": _CHUNKED + b"5\r\nhelloX\r\n0\r\n\r\n",
    "both framing headers": _HEAD
    + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"0\r\n\r\n",
    "two lengths": _HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "a length list": _HEAD + b"Content-Length: 5, 5\r\n\r\nhello",
    "signed length": _HEAD + b"Content-Length: +5\r\n\r\nhello",
    "unknown coding": _HEAD + b"Transfer-Encoding: gzip\r\n\r\nhello",
    "chunked in HTTP/1.0": b"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"0\r\n\r\n",
    "bare LF": b"GET / HTTP/1.1\nHost: x\n\n",
    "obs-fold": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  b\r\n\r\n",
    "NUL in a value": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "NUL in the target": b"GET /a\x00b HTTP/1.1\r\nHost: x\r\n\r\n",
    "space before colon": b"GET / HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n",
    "no Host": b"GET / HTTP/1.1\r\n\r\n",
    "two Hosts": b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    "oversize head": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * MAX_HEAD + b"\r\n\r\n",
    "too many headers": b"GET / HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1))
    + b"\r\n",
    "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    "upgrade": b"GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_framing_is_answered_4xx_and_closed(name: str) -> None:
    data = MALFORMED[name]
    # One valid request first: it is served, and the malformed one after it is refused.
    valid = b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
    for chunks in ([valid + data], [valid, data], _split(valid + data, [len(valid) + 20])):
        seen, out = _serve(chunks)
        assert [target for _, target, _, _ in seen] == [b"/first"], name
        statuses = _statuses(out)
        assert statuses[0] == 200 and len(statuses) == 2, (name, out)
        assert 400 <= statuses[1] < 500, (name, out)
        assert out.rstrip(b"\r\n").lower().count(b"connection: close") == 1
