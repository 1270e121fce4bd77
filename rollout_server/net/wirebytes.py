"""The bytes the lean HTTP/1.1 server writes: an answer's head and its body's framing.

Parsing is httptools' (llhttp); writing is ours, as uvicorn's is, because an answer is a few
byte strings joined. What is written is what h11 0.16 writes for the same answer to the same
request, byte for byte and error for error (``tests/rollout_server/net/test_wirebytes.py``
holds it against h11 over generated answers):

- the status line ``HTTP/1.1 <code> \\r\\n`` (h11 writes no reason phrase), then the headers
  in the order given except that ``host`` goes first, then what h11 adds or rewrites:
  ``Transfer-Encoding: chunked`` for an answer with no ``content-length`` (instead of any
  ``content-length`` when a ``transfer-encoding`` is given), and ``Connection: close`` when
  the request or the answer ends the connection (both moved to the end, title-cased, as h11's
  ``set_comma_header`` does);
- the answer to an HTTP/1.0 request is never chunked: its body runs to the close;
- a name outside the token characters, a value with NUL, line breaks or surrounding blanks,
  conflicting lengths or a transfer coding other than ``chunked`` raise
  :class:`LocalProtocolError`, as do a body longer or shorter than its ``content-length``.

The common answer (a status from 200, plain headers, a keep-alive HTTP/1.1 request) takes a
short path, :func:`_plain_head`; everything else goes through :func:`_general_head`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

__all__ = ["CHUNKED", "TO_CLOSE", "Body", "LocalProtocolError", "response_head"]

CHUNKED: Final = -1
"""Body length meaning: chunked framing."""
TO_CLOSE: Final = -2
"""Body length meaning: the body runs until the connection closes (HTTP/1.0 clients)."""

_TOKEN: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_VALUE: Final = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")
_LENGTH: Final = re.compile(rb"[0-9]{1,20}")
# Response headers h11 reorders, rewrites or frames by.
_FRAMING: Final = frozenset((b"content-length", b"transfer-encoding", b"connection", b"host"))


class LocalProtocolError(Exception):
    """The app asked for an answer HTTP/1.1 cannot carry (h11's error of the same name)."""


def response_head(
    status: int,
    headers: Iterable[tuple[Any, Any]],
    keep_alive: bool,
    *,
    head: bool = False,
    http10: bool = False,
) -> tuple[bytes, int, bool]:
    """The head of an answer, its body's length and whether the connection stays open.

    ``keep_alive`` is the request's (False when it asked to close, or is HTTP/1.0); ``head``
    says the request was ``HEAD``; ``http10`` that it was HTTP/1.0. The length is the
    ``content-length``, :data:`CHUNKED` or :data:`TO_CLOSE`; answers that carry no body by
    rule (204, 304, to ``HEAD``) have length 0 whatever their headers say.
    """
    if not (head or http10):
        plain = _plain_head(status, headers, keep_alive)
        if plain is not None:
            return plain
    return _general_head(status, list(headers), keep_alive, head, http10)


def _plain_head(
    status: int, headers: Iterable[tuple[Any, Any]], keep_alive: bool
) -> tuple[bytes, int, bool] | None:
    if not 200 <= status < 1000 or status == 204 or status == 304:
        return None
    out = [b"HTTP/1.1 %d \r\n" % status]
    length = CHUNKED
    stays = keep_alive
    token = _TOKEN.fullmatch
    valid = _VALUE.fullmatch
    for name, value in headers:
        if type(name) is not bytes or type(value) is not bytes:
            return None
        if token(name) is None or valid(value) is None:
            return None
        lower = name.lower()
        if lower in _FRAMING:
            if lower == b"content-length":
                if length >= 0 or _LENGTH.fullmatch(value) is None:
                    return None
                length = int(value)
            elif lower == b"connection" and keep_alive:
                if b"close" in [item.strip() for item in value.lower().split(b",")]:
                    stays = False
            else:
                return None
        out.append(b"%s: %s\r\n" % (name, value))
    if length < 0:
        out.append(b"Transfer-Encoding: chunked\r\n")
    if not keep_alive:
        out.append(b"Connection: close\r\n")
    out.append(b"\r\n")
    return b"".join(out), length, stays


def _bytes(value: Any) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        try:
            return value.encode("ascii")
        except UnicodeEncodeError:
            raise LocalProtocolError(f"header text is not ASCII: {value!r}") from None
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"header names and values are bytes, not {type(value).__name__}")


def _general_head(
    status: int, given: list[tuple[Any, Any]], keep_alive: bool, head: bool, http10: bool
) -> tuple[bytes, int, bool]:
    """h11's ``Response`` validation and ``_clean_up_response_headers_for_sending``."""
    if not 200 <= status < 1000:
        raise LocalProtocolError("Response status_code should be in range [200, 1000)")
    headers: list[tuple[bytes, bytes, bytes]] = []  # (raw name, lower name, value)
    length: bytes | None = None
    chunked = False
    for raw_name, raw_value in given:
        name, value = _bytes(raw_name), _bytes(raw_value)
        if _TOKEN.fullmatch(name) is None:
            raise LocalProtocolError(f"Illegal header name {name!r}")
        if _VALUE.fullmatch(value) is None:
            raise LocalProtocolError(f"Illegal header value {value!r}")
        lower = name.lower()
        if lower == b"content-length":
            lengths = {item.strip() for item in value.split(b",")}
            if len(lengths) != 1:
                raise LocalProtocolError("conflicting Content-Length headers")
            value = lengths.pop()
            if _LENGTH.fullmatch(value) is None:
                raise LocalProtocolError("bad Content-Length")
            if length is not None:
                if length != value:
                    raise LocalProtocolError("conflicting Content-Length headers")
                continue
            length = value
        elif lower == b"transfer-encoding":
            if chunked:
                raise LocalProtocolError("multiple Transfer-Encoding headers")
            value = value.lower()
            if value != b"chunked":
                raise LocalProtocolError("Only Transfer-Encoding: chunked is supported")
            chunked = True
        headers.append((name, lower, value))
    empty = status in (204, 304) or head
    # Framing as h11 chooses the headers: a HEAD answer is framed as the GET answer would be.
    framing = "chunked" if chunked else "length" if length is not None else "http/1.0"
    if status in (204, 304):
        framing = "length"
    close = not keep_alive
    if framing != "length":
        headers = [h for h in headers if h[1] != b"content-length"]
        headers = [h for h in headers if h[1] != b"transfer-encoding"]
        if http10:
            if not head:
                close = True
        else:
            headers.append((b"Transfer-Encoding", b"transfer-encoding", b"chunked"))
    tokens = _connection_tokens(headers)
    if close:
        tokens.discard(b"keep-alive")
        tokens.add(b"close")
        headers = [h for h in headers if h[1] != b"connection"]
        headers.extend((b"Connection", b"connection", token) for token in sorted(tokens))
    stays = keep_alive and not close and b"close" not in tokens
    out = [b"HTTP/1.1 %d \r\n" % status]
    out.extend(b"%s: %s\r\n" % (raw, value) for raw, lower, value in headers if lower == b"host")
    out.extend(b"%s: %s\r\n" % (raw, value) for raw, lower, value in headers if lower != b"host")
    out.append(b"\r\n")
    if empty:
        body = 0
    elif framing == "length":
        assert length is not None
        body = int(length)
    else:
        body = TO_CLOSE if http10 else CHUNKED
    return b"".join(out), body, stays and body != TO_CLOSE


def _connection_tokens(headers: list[tuple[bytes, bytes, bytes]]) -> set[bytes]:
    """h11's ``get_comma_header(headers, b"connection")`` as a set."""
    tokens: set[bytes] = set()
    for _, lower, value in headers:
        if lower == b"connection":
            for item in value.split(b","):
                item = item.strip().lower()
                if item:
                    tokens.add(item)
    return tokens


class Body:
    """The framing of one answer's body: :meth:`data` for each piece, :meth:`end` once."""

    __slots__ = ("done", "remaining")

    def __init__(self, length: int) -> None:
        self.remaining = length
        self.done = False

    def data(self, data: bytes) -> bytes:
        """The bytes for one piece of body (``data`` not empty)."""
        self._check()
        if self.remaining == CHUNKED:
            return b"%x\r\n%s\r\n" % (len(data), data)
        if self.remaining == TO_CLOSE:
            return data
        self.remaining -= len(data)
        if self.remaining < 0:
            self.done = True
            raise LocalProtocolError("Too much data for declared Content-Length")
        return data

    def end(self) -> bytes:
        """The bytes that end the body."""
        self._check()
        self.done = True
        if self.remaining == CHUNKED:
            return b"0\r\n\r\n"
        if self.remaining > 0:
            raise LocalProtocolError("Too little data for declared Content-Length")
        return b""

    def _check(self) -> None:
        if self.done:
            raise LocalProtocolError("Can't send data when the answer is over")
