"""The common HTTP/1.1 exchange of :mod:`rollout_server.net.wire` without h11.

h11 builds, validates and dispatches events for every request and answer: in the rollout
client that was most of the CPU its calls cost. Most exchanges are the same simple shape: a
request with a known length and ordinary headers, and an ``HTTP/1.1`` answer with a
``content-length``. This module writes the first and reads the head of the second directly,
and says when an exchange is anything else, so the caller hands it to h11 with the bytes read
so far; the answer is then exactly what h11 makes of them.

Both halves follow h11 0.16 to the byte (``tests/rollout_server/net/test_wirefast.py`` holds
them against h11 itself over generated requests and answer streams):

* :func:`encode_request` writes what h11 writes: the request line, ``host`` first, the other
  headers in order and as given, then the body. It returns ``None`` for anything it does not
  vouch for: a name or value h11 would refuse (a name outside the token characters, a value
  with control characters, line breaks or surrounding blanks, which also rules out header
  injection), a method outside the common ones (``CONNECT`` switches protocols), and headers
  that change framing or the connection's fate (``content-length``, ``transfer-encoding``,
  ``connection``, ``upgrade``, ``expect``, a second ``host``).
* :func:`parse_head` takes a head h11 would take the same way: status line ``HTTP/1.1``,
  final status (200 or more), lines ending in CRLF with no folding, one
  ``content-length`` of plain digits (or none where the body is empty by rule: 204, 304, an
  answer to ``HEAD``), no ``transfer-encoding``, no ``connection: close``. Those answers keep
  the connection reusable once their body is read, as h11 would. Anything else raises
  :class:`Unusual`, including what h11 would fail on (an incomplete head past its 16 KiB
  limit, a first byte no status line starts with), so h11 raises its own error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = ["MAX_HEAD", "CheckedHeaders", "Head", "Unusual", "encode_request", "parse_head"]

MAX_HEAD: Final = 16 * 1024
"""h11's limit on an incomplete event (its default ``max_incomplete_event_size``)."""

_TOKEN: Final = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_CONTENT: Final = rb"[^\x00\s]+(?:[ \t]+[^\x00\s]+)*"

_NAME = re.compile(_TOKEN)
_VALUE = re.compile(rb"(?:" + _CONTENT + rb")?")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_HEAD = re.compile(
    rb"HTTP/1\.1 ([0-9]{3})(?: [^\x00\n\r\x0b\x0c]*)?\r\n"
    rb"((?:" + _TOKEN + rb":[ \t]*(?:" + _CONTENT + rb")?[ \t]*\r\n)*)\r\n"
)
_FIELD = re.compile(rb"(" + _TOKEN + rb"):[ \t]*((?:" + _CONTENT + rb")?)[ \t]*\r\n")
_DIGITS = re.compile(rb"[0-9]{1,20}")

_METHODS: Final = frozenset((b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS"))
_OURS: Final = frozenset(
    (b"host", b"content-length", b"transfer-encoding", b"connection", b"upgrade", b"expect")
)
_EMPTY: Final = (204, 304)

Head = tuple[int, list[tuple[bytes, bytes]], int, int]
"""Status, headers, body length, and the offset where the body starts."""


class Unusual(Exception):
    """The answer is not the simple kind: h11 must read it (from the bytes read so far)."""


class CheckedHeaders(tuple[tuple[bytes, bytes], ...]):
    """Request headers checked and encoded once, for a caller that sends the same ones on
    every request: :func:`encode_request` then writes their bytes without checking each
    header again. Immutable (a tuple), so the bytes stay those of the headers."""

    encoded: bytes | None
    """Their lines as :func:`encode_request` writes them; ``None`` when h11 must write them."""

    def __new__(cls, headers: Sequence[tuple[bytes, bytes]]) -> CheckedHeaders:
        self = super().__new__(cls, headers)
        self.encoded = _encode_fields(self)
        return self


def _encode_fields(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    parts = []
    for name, value in headers:
        if (
            type(name) is not bytes
            or type(value) is not bytes
            or not _NAME.fullmatch(name)
            or not _VALUE.fullmatch(value)
            or name.lower() in _OURS
        ):
            return None
        parts.append(b"%s: %s\r\n" % (name, value))
    return b"".join(parts)


def encode_request(
    method: bytes,
    target: bytes,
    host: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    content_length: bool,
) -> bytes | None:
    """The bytes h11 writes for this request, or ``None`` when h11 must write it.

    ``host`` is the value of the ``host`` header; ``content_length`` adds one for ``body``.
    """
    if type(method) is not bytes or method not in _METHODS or (body and not content_length):
        return None
    if type(target) is not bytes or not _TARGET.fullmatch(target):
        return None
    if type(host) is not bytes or not _VALUE.fullmatch(host):
        return None
    fields = headers.encoded if type(headers) is CheckedHeaders else _encode_fields(headers)
    if fields is None:
        return None
    length = b"content-length: %d\r\n" % len(body) if content_length else b""
    return b"%s %s HTTP/1.1\r\nhost: %s\r\n%s%s\r\n%s" % (
        method,
        target,
        host,
        fields,
        length,
        body,
    )


def parse_head(buffer: bytes, method: bytes) -> Head | None:
    """The answer's head at the start of ``buffer``: status, headers (names in lower case,
    values as h11 keeps them), body length and where the body starts; ``None`` while the head
    is incomplete. Raises :class:`Unusual` for an answer h11 must read."""
    match = _HEAD.match(buffer)
    if match is None:
        # A complete head that did not match is not the simple kind. h11 would find a head at
        # a bare LF, and fail on a first byte below 0x21 or on an incomplete head past its
        # limit: no line of a simple head ends so, none starts so, and none is that long.
        if buffer and (
            buffer[0] < 0x21
            or len(buffer) > MAX_HEAD
            or b"\r\n\r\n" in buffer
            or buffer.count(b"\n") != buffer.count(b"\r\n")
        ):
            raise Unusual
        return None
    status = int(match[1])
    if status < 200:
        raise Unusual
    headers = []
    length = -1
    for name, value in _FIELD.findall(match[2]):
        name = name.lower()
        if name == b"content-length":
            if length != -1 or not _DIGITS.fullmatch(value):
                raise Unusual
            length = int(value)
        elif name == b"transfer-encoding" or (name == b"connection" and b"close" in value.lower()):
            raise Unusual
        headers.append((name, value))
    if status in _EMPTY or method == b"HEAD":
        length = 0
    elif length == -1:
        raise Unusual
    return status, headers, length, match.end()
