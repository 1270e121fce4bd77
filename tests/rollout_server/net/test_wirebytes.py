"""The lean server's writers (rollout_server.net.wirebytes) against h11 writing the same answer.

h11 is the oracle: for a generated answer (status, headers as an app gives them, body pieces)
to a generated request (GET or HEAD, HTTP/1.1 or 1.0, keep-alive or not), our head and body
bytes, our errors and whether the connection stays open must be h11's, byte for byte.
"""

from __future__ import annotations

from typing import Any

import h11
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_server.net.wirebytes import Body, LocalProtocolError, response_head

_SETTINGS = settings(
    derandomize=True,
    deadline=None,
    max_examples=1500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_VALUE_BYTES = b"aZ09 \t,;=-\x00\x01\x7f\x80\xff\x0b\r"
_NAMES = [
    b"Content-Type",
    b"content-length",
    b"Content-Length",
    b"connection",
    b"Connection",
    b"Host",
    b"transfer-encoding",
    b"Transfer-Encoding",
    b"X-A",
    b"set-cookie",
    b"Bad Name",
    "x-str",
    "x-\xe9",
]


@st.composite
def _answers(draw: st.DrawFn) -> tuple[int, list[Any], list[bytes]]:
    status = draw(st.sampled_from([200, 200, 201, 404, 500, 999, 100, 204, 304, 1000, 199]))
    pieces = draw(st.lists(st.binary(max_size=6), max_size=3))
    total = sum(map(len, pieces))
    headers: list[Any] = []
    for name in draw(st.lists(st.sampled_from(_NAMES), max_size=5)):
        lower = name.lower() if isinstance(name, bytes) else b""
        if lower == b"content-length":
            value = draw(
                st.sampled_from(
                    [
                        b"%d" % total,
                        b"%d" % total,
                        b"%d" % (total + 1),
                        b"x",
                        b"%d, %d" % (total, total),
                        b"%d, %d" % (total, total + 1),
                    ]
                )
            )
        elif lower == b"connection":
            value = draw(st.sampled_from([b"close", b"keep-alive", b"Upgrade, Close", b"x, , y"]))
        elif lower == b"transfer-encoding":
            value = draw(st.sampled_from([b"chunked", b"Chunked", b"gzip"]))
        else:
            value = bytes(draw(st.lists(st.sampled_from(_VALUE_BYTES), max_size=6)))
        headers.append((name, value))
    return status, headers, pieces


_REQUESTS = st.tuples(
    st.sampled_from([b"GET", b"HEAD"]), st.sampled_from([b"1.1", b"1.0"]), st.booleans()
)


def _h11_answer(request: tuple[bytes, bytes, bool], answer: Any) -> list[Any]:
    method, version, keep = request
    status, headers, pieces = answer
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(
        b"%s / HTTP/%s\r\nHost: x\r\n%s\r\n"
        % (method, version, b"" if keep else b"Connection: close\r\n")
    )
    conn.next_event()
    steps: list[Any] = []
    try:
        steps.append(conn.send(h11.Response(status_code=status, headers=headers)))
        # The loop drops the app's body bytes where the answer has no body by rule.
        if method != b"HEAD" and status not in (204, 304):
            steps.extend(conn.send(h11.Data(data=piece)) for piece in pieces if piece)
        steps.append(conn.send(h11.EndOfMessage()))
    except (h11.LocalProtocolError, UnicodeEncodeError):
        return [*steps, "error"]
    return [*steps, conn.our_state is h11.DONE]


def _our_answer(request: tuple[bytes, bytes, bool], answer: Any) -> list[Any]:
    method, version, keep = request
    status, headers, pieces = answer
    http10 = version == b"1.0"
    steps: list[Any] = []
    try:
        data, length, stays = response_head(
            status, headers, keep and not http10, head=method == b"HEAD", http10=http10
        )
        steps.append(data)
        body = Body(length)
        if method != b"HEAD" and status not in (204, 304):
            steps.extend(body.data(piece) for piece in pieces if piece)
        steps.append(body.end())
    except LocalProtocolError:
        return [*steps, "error"]
    return [*steps, stays]


@_SETTINGS
@given(request=_REQUESTS, answer=_answers())
def test_every_answer_is_written_as_h11_writes_it(request: Any, answer: Any) -> None:
    assert _our_answer(request, answer) == _h11_answer(request, answer)


def test_the_usual_answers_take_the_short_path() -> None:
    from rollout_server.net.wirebytes import _plain_head

    for keep in (True, False):
        for headers in (
            [(b"content-type", b"application/json"), (b"content-length", b"2")],
            [(b"content-type", b"text/event-stream"), (b"cache-control", b"no")],
            [(b"content-length", b"0"), (b"connection", b"close")],
        ):
            if keep or headers[-1][0] != b"connection":
                assert _plain_head(200, headers, keep) is not None
