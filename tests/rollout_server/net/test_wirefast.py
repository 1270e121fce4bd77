"""The lean client (rollout_server/net/wire.py, wirefast.py) against h11 itself.

Requests: whatever the fast writer writes is byte for byte what h11 writes, and it writes
nothing h11 would refuse. Answers (read by httptools): the same byte stream, cut at any offsets,
through :class:`~rollout_server.net.wire.WirePool` and through h11 alone: an answer the pool
reads is the answer h11 reads (status, headers, body), a connection the pool reuses h11 would
reuse, and a stream h11 fails on fails in the pool too. The pool may be stricter (llhttp
refuses bare LF and folded heads h11 takes; bytes after an answer close the connection).
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Sequence

import h11
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_server.net.wire import (
    BadAnswer,
    Connection,
    ConnectionLost,
    Origin,
    ReadFailed,
    WireError,
    WirePool,
)
from rollout_server.net.wirefast import CheckedHeaders, encode_request

Header = tuple[bytes, bytes]
Outcome = tuple[object, ...]

HOST = b"example.test"
MAX_HEAD = 16 * 1024
TARGET = b"/v1/chat/completions"
RESET = "connection reset by peer"
_SETTINGS = settings(
    max_examples=800,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- requests ------------------------------------------------------------------------------

METHODS = [b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS"]
NAMES = [
    b"content-type",
    b"Authorization",
    b"X-Request-Id",
    b"accept-encoding",
    b"host",
    b"Host",
    b"content-length",
    b"Content-Length",
    b"transfer-encoding",
    b"Connection",
    b"upgrade",
    b"Expect",
    b"te",
    b"bad name",
    b"",
    b"x:y",
    b"x\r\ny",
    b"caf\xe9",
]
VALUES = [
    b"application/json",
    b"Bearer sk-0123456789",
    b"",
    b"gzip, deflate",
    b" leading",
    b"trailing ",
    b"a\r\nInjected: 1",
    b"a\nb",
    b"a\x00b",
    b"tab\tinside",
    b"\xff\xfe",
    b"chunked",
    b"close",
    b"100-continue",
    b"12",
]
TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

names = st.one_of(st.sampled_from(NAMES), st.text(TOKEN + " :\x7f", min_size=0, max_size=8))
values = st.one_of(st.sampled_from(VALUES), st.binary(max_size=12))
requests = st.tuples(
    st.one_of(st.sampled_from(METHODS), st.sampled_from([b"CONNECT", b"get", b"BAD M", b""])),
    st.sampled_from([TARGET, b"/", b"/x?y=1&z=%20", b"*", b"", b"/a b", b"/\x7f", b"/caf\xc3\xa9"]),
    st.lists(st.tuples(names.map(lambda n: n if isinstance(n, bytes) else n.encode()), values)),
    st.binary(max_size=40),
)


def _h11_request(
    method: bytes, target: bytes, headers: Sequence[Header], body: bytes
) -> tuple[h11.Connection, bytes]:
    """What the client wrote before the fast path (raises what h11 raises)."""
    protocol = h11.Connection(h11.CLIENT)
    head = [(b"host", HOST), *headers]
    if body or method in (b"POST", b"PUT", b"PATCH"):
        head.append((b"content-length", b"%d" % len(body)))
    data = protocol.send(h11.Request(method=method, target=target, headers=head))
    if body:
        data += protocol.send(h11.Data(data=body))
    return protocol, data + protocol.send(h11.EndOfMessage())


@_SETTINGS
@given(requests)
def test_requests_are_written_as_h11_writes_them(
    request: tuple[bytes, bytes, list[Header], bytes],
) -> None:
    method, target, headers, body = request
    sized = bool(body) or method in (b"POST", b"PUT", b"PATCH")
    ours = encode_request(method, target, HOST, headers, body, sized)
    # Headers checked once write the same bytes, and are refused alike.
    assert encode_request(method, target, HOST, CheckedHeaders(headers), body, sized) == ours
    if ours is None:
        return
    _, theirs = _h11_request(method, target, headers, body)  # raising here fails the test
    assert ours == theirs


def test_ordinary_requests_take_the_fast_path() -> None:
    """The requests the project sends are the fast path's, byte for byte h11's."""
    cases: list[tuple[bytes, bytes, list[Header], bytes]] = [
        (b"POST", b"/rollout", [(b"authorization", b"Bearer sk-x")], b'{"a": 1}'),
        (b"GET", b"/rollout/r-1/result?wait=30", [], b""),
        (b"POST", TARGET, [(b"Content-Type", b"application/json"), (b"x", b"")], b"{}"),
        (b"DELETE", b"/x", [(b"user-agent", b"rollbridge")], b""),
        (b"POST", b"/", [], b""),
    ]
    for method, target, headers, body in cases:
        sized = bool(body) or method == b"POST"
        ours = encode_request(method, target, HOST, headers, body, sized)
        assert ours == _h11_request(method, target, headers, body)[1]
        assert encode_request(method, target, HOST, CheckedHeaders(headers), body, sized) == ours


# --- answers -------------------------------------------------------------------------------


def _chunked(body: bytes, cuts: list[int]) -> bytes:
    edges = [0, *sorted(set(cuts)), len(body)]
    parts = [body[a:b] for a, b in itertools.pairwise(edges) if b > a]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


ORDINARY = [
    b"content-type: application/json",
    b"date: Mon, 01 Dec 2025 17:00:00 GMT",
    b"Server:rollbridge",
    b"x-empty:",
    b"x-spaced:   a  b \t",
    b"x-latin: caf\xe9",
    b"Connection: keep-alive",
]
ODD_FIELDS = [
    b"CONTENT-LENGTH: %d",  # the body's length plus one
    b"content-length: %d, %d",
    b"content-length: +%d",
    b"content-length: " + b"1" * 21,
    b"Transfer-Encoding: gzip",
    b"connection: upgrade",
    b" folded",
    b"bad name: x",
    b": no name",
    b"no colon",
    b"x-nul: a\x00b",
    b"x-long: " + b"y" * (MAX_HEAD + 100),
]
#: Ways an answer departs from the simple kind; an answer takes none, one or two of them.
DEPARTURES = [
    "version",
    "status",
    "code",
    "reason",
    "eol",
    "field",
    "chunked",
    "close",
    "unframed",
    "prefix",
]


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A request method and the answer's bytes: the simple kind, or departing from it, and
    sometimes cut short."""
    pick = draw
    method = pick(st.sampled_from([b"POST", b"POST", b"GET", b"HEAD"]))
    departures = pick(st.lists(st.sampled_from(DEPARTURES), max_size=2, unique=True))
    version = b"HTTP/1.1"
    if "version" in departures:
        version = pick(st.sampled_from([b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 "]))
    status = pick(st.sampled_from([200, 201, 202, 204, 304, 404, 500]))
    if "status" in departures:
        status = pick(st.sampled_from([100, 101, 103, 199, 99]))
    code = b"%d" % status
    if "code" in departures:
        code = pick(st.sampled_from([b"20", b"2000", b"2x0", b""]))
    reason = pick(st.sampled_from([b" OK", b" ", b"", b" Accepted", b" odd \t why\xff"]))
    if "reason" in departures:
        reason = pick(st.sampled_from([b" bad\x00", b" a\rb", b" \x0b", b"OK"]))
    body = pick(st.one_of(st.binary(max_size=200), st.binary(min_size=20, max_size=80)))
    fields = pick(st.lists(st.sampled_from(ORDINARY), max_size=4))
    length = b"content-length: %d" % len(body)
    if "chunked" in departures:
        body = _chunked(body, pick(st.lists(st.integers(0, len(body)), max_size=3)))
        fields.append(pick(st.sampled_from([b"transfer-encoding: chunked", b"TE-less: x"])))
        if pick(st.booleans()):
            fields.append(length)
    elif "unframed" not in departures:
        fields.append(length)
    if "close" in departures:
        fields.append(
            pick(st.sampled_from([b"connection: close", b"Connection: Keep-Alive, Close"]))
        )
    if "field" in departures:
        odd = pick(st.sampled_from(ODD_FIELDS))
        fields.append(odd % ((len(body) + 1,) * odd.count(b"%d")))
    fields = pick(st.permutations(fields))
    eol = b"\r\n"
    if "eol" in departures:
        eol = pick(st.sampled_from([b"\n", b"\r\r\n"]))
    stream = b"".join(line + eol for line in [version + b" " + code + reason, *fields])
    stream += eol
    head = len(stream)
    stream += body
    if "prefix" in departures:
        before = [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 \r\nlink: x\r\n\r\n", b"\r\n"]
        stream = pick(st.sampled_from([*before, b"\x16\x03", b" "])) + stream
    if pick(st.integers(0, 3)) == 0:  # the connection ends (or fails) before the answer does
        cut = pick(st.integers(head, len(stream)) if pick(st.booleans()) else st.integers(0, head))
        stream = stream[:cut]
    trailing = [b"", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"junk"]
    return method, stream + pick(st.sampled_from(trailing))


class Scripted(trio.abc.Stream):
    """A connection that takes whatever is written and answers each read with the next of
    ``pieces``, then with its end (``b""``) or, when ``reset``, a failure."""

    def __init__(self, pieces: list[bytes], reset: bool) -> None:
        self.sent = b""
        self._pieces = pieces
        self._reset = reset

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self.sent += bytes(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self._pieces:
            return self._pieces.pop(0)
        if self._reset:
            raise trio.BrokenResourceError(RESET)
        return b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _lost(kind: type[ConnectionLost], exc: BaseException, answering: bool) -> Outcome:
    """The failure the client raised before the fast path, as an outcome."""
    shown = str(exc) or type(exc).__name__
    if answering:
        return ("failed", kind.__name__, shown, False)
    return (
        "failed",
        kind.__name__,
        f"Server disconnected without sending a response ({shown})",
        True,
    )


def _through_h11(
    method: bytes, headers: Sequence[Header], body: bytes, pieces: list[bytes], reset: bool
) -> tuple[Outcome, bytes]:
    """One exchange the way the client made it with h11 alone: its outcome, bytes written."""
    try:
        protocol, sent = _h11_request(method, TARGET, headers, body)
    except h11.LocalProtocolError as exc:
        return ("refused", str(exc)), b""
    feed = list(pieces)
    answering = False

    def receive() -> bytes:
        nonlocal answering
        if feed:
            answering = True
            return feed.pop(0)
        if reset:
            raise _Failed(_lost(ReadFailed, trio.BrokenResourceError(RESET), answering))
        return b""

    try:
        while True:  # the head
            try:
                event = protocol.next_event()
            except h11.RemoteProtocolError as exc:
                return _lost(BadAnswer, exc, answering), sent
            if event is h11.NEED_DATA:
                protocol.receive_data(receive())
            elif type(event) is h11.Response:
                break
            elif type(event) is h11.ConnectionClosed:
                gone = "Server disconnected without sending a response"
                return ("failed", "BadAnswer", gone, True), sent
            elif not isinstance(event, h11.InformationalResponse):
                return (
                    "failed",
                    "BadAnswer",
                    f"unexpected {type(event).__name__}",
                    True,
                ), sent
        parts = []
        while True:  # the body
            try:
                piece = protocol.next_event()
            except h11.RemoteProtocolError as exc:
                return _lost(BadAnswer, exc, answering), sent
            if piece is h11.NEED_DATA:
                protocol.receive_data(receive())
            elif type(piece) is h11.Data:
                parts.append(bytes(piece.data))
            elif type(piece) is h11.EndOfMessage:
                break
            else:
                return (
                    "failed",
                    "BadAnswer",
                    f"unexpected {type(piece).__name__}",
                    False,
                ), sent
    except _Failed as failed:
        return failed.outcome, sent
    reused = protocol.our_state is h11.DONE and protocol.their_state is h11.DONE
    left = protocol.trailing_data[0] if reused else None
    answer = ("answer", event.status_code, list(event.headers), b"".join(parts), reused, left)
    return answer, sent


class _Failed(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


async def _through_pool(
    method: bytes, headers: Sequence[Header], body: bytes, pieces: list[bytes], reset: bool
) -> tuple[Outcome, bytes, bool]:
    """One exchange through WirePool: its outcome, the bytes written, and whether the answer's
    head was read without h11."""
    ours, theirs = socket.socketpair()
    connection = Connection(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "k")
    stream = connection.stream = Scripted(list(pieces), reset)
    pool = WirePool(decompress=False)
    fast = False
    try:
        with trio.fail_after(10):
            response = await pool.send(
                connection, Origin("http", HOST.decode(), 80), method, TARGET, headers, body
            )
            fast = True
            try:
                data = await response.read()
            except BaseException:
                response.discard()
                raise
        reused = pool._idle_count == 1
        left = b"" if reused else None
        outcome: Outcome = (
            "answer",
            response.status,
            list(response.raw_headers),
            data,
            reused,
            left,
        )
    except WireError as exc:
        outcome = ("failed", type(exc).__name__, str(exc), exc.before_answer)
    except h11.LocalProtocolError as exc:
        outcome = ("refused", str(exc))
    finally:
        await pool.aclose()
        connection.socket.close()
        theirs.close()
    return outcome, stream.sent, fast


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges) if b > a]


@_SETTINGS
@given(
    answers(),
    st.lists(st.integers(0, MAX_HEAD + 400), max_size=6),
    st.booleans(),
    st.sampled_from([[], [(b"authorization", b"Bearer sk-1")], [(b"Connection", b"close")]]),
)
def test_answers_end_as_they_do_through_h11(
    answer: tuple[bytes, bytes], cuts: list[int], reset: bool, headers: list[Header]
) -> None:
    method, stream = answer
    pieces = _cut(stream, cuts)
    body = b"{}" if method == b"POST" else b""
    expected, written = _through_h11(method, headers, body, pieces, reset)
    outcome, sent, _ = trio.run(_through_pool, method, headers, body, pieces, reset)
    assert sent == written
    if b"x-long: " + b"y" * MAX_HEAD in stream:
        # A head longer than MAX_HEAD: h11 bounds only a head that is still incomplete, so
        # whether it refuses one depends on where the bytes were cut and how much each read
        # took (seen both ways in one run); there is no single outcome to match. What must
        # hold is that the answer is read or the exchange fails as lost, nothing else.
        assert outcome[0] in ("answer", "failed"), (stream, outcome)
        return
    if outcome[0] == "answer":
        assert expected[0] == "answer", (stream, outcome, expected)
        assert outcome[1:4] == expected[1:4]
        if outcome[4]:
            assert expected[4] and expected[5] == b"", (stream, outcome, expected)
    if expected[0] != "answer":
        assert outcome[0] == expected[0], (stream, outcome, expected)


SIMPLE = [
    b'HTTP/1.1 202 \r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"id": "1"}',
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Empty:\r\nx-pad: \t a b \t\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\ndate: Mon, 01 Dec 2025 17:00:00 GMT\r\n\r\n",
    # Bytes beyond the answer stay on the connection for the next one, as with h11.
    b"HTTP/1.1 404\r\ncontent-length: 3\r\nconnection: keep-alive\r\n\r\nno!HTTP/1.1 200",
]


@pytest.mark.parametrize("stream", SIMPLE)
def test_simple_answers_at_every_cut(stream: bytes) -> None:
    """The simple kind is read however it arrives, and ends as through h11."""
    for cut in range(len(stream) + 1):
        pieces = _cut(stream, [cut])
        expected, _ = _through_h11(b"POST", [], b"{}", pieces, False)
        outcome, _, _ = trio.run(_through_pool, b"POST", [], b"{}", pieces, False)
        assert outcome[:4] == expected[:4]


def test_a_connection_with_bytes_beyond_the_answer_is_not_kept() -> None:
    """A 204 carries no body whatever its Content-Length says, so what follows it on the wire
    is a message nobody asked for: the connection is closed, not pooled with it half read."""
    stream = (
        b"HTTP/1.1 204 No Content\r\ncontent-length: 10\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    head = stream.index(b"\r\n\r\n") + 4
    # With the answer's read: one byte of the next message, or all of it. (Bytes that come
    # after the answer was read are the stale check's to find, at the next reuse.)
    for cut in (head + 1, len(stream)):
        outcome, _, _ = trio.run(_through_pool, b"POST", [], b"{}", _cut(stream, [cut]), False)
        assert outcome[:4] == ("answer", 204, [(b"content-length", b"10")], b"")
        assert outcome[4] is False, cut
    # A whole 1xx after the answer, which the parser skips (as before any answer): still a
    # message nobody asked for. (Found by the property test below, in some runs only.)
    stray = b"HTTP/1.1 204 OK\r\ncontent-length: 20\r\n\r\nHTTP/1.0 100\r\n!:\r\n\r\n"
    outcome, _, _ = trio.run(_through_pool, b"POST", [], b"{}", [stray], False)
    assert outcome[:4] == ("answer", 204, [(b"content-length", b"20")], b"")
    assert outcome[4] is False
