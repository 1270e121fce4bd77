"""A plain-request reader for the lean fake provider (tests/fakes/lean_upstream.py).

It was the lean server's fast path before httptools became the server's parser (issue 23);
the fake provider keeps it because its CPU per call is part of what the benchmarks measure
and it hands every request it declines to h11 anyway.


:func:`parse_request` reads an HTTP/1.1 request head of the plain kind (a method the servers
route, an origin-form target, exactly one ``Host``, a digits-only ``Content-Length`` or no
body, no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``, no line folding, CRLF line ends).
It returns what h11 would report for those bytes, :data:`NEED_DATA` where h11 would wait for
more, or :data:`DECLINED` for anything else (malformed, unusual or merely unfamiliar bytes):
h11 then sees the very same bytes, so it alone decides every case this module is not sure of.

"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["DECLINED", "NEED_DATA", "Request", "parse_request"]

NEED_DATA: Final = 1
"""The head is incomplete and may still turn out plain: read more."""
DECLINED: Final = 2
"""Not a request this module is sure of: let h11 read the same bytes."""

# RFC 9110/9112 grammar as h11 applies it: a token, a field value (visible bytes, obs-text and
# control bytes other than NUL/whitespace, inner runs of spaces or tabs), an origin-form target.
_TOKEN: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_VALUE: Final = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")
_TARGET: Final = re.compile(rb"/[\x21-\x7e]*")
# Header lines, each after a CRLF: no folding (a line may not start with a space or tab). The
# trailing whitespace belongs to the value's group so that no run of spaces can be split two
# ways: a failing match stays linear in the head's length.
_FIELDS: Final = re.compile(
    rb"(?:\r\n[-!#$%&'*+.^_`|~0-9a-zA-Z]+:[ \t]*(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*[ \t]*)?)+"
)
_LENGTH: Final = re.compile(rb"[0-9]{1,20}")
_METHODS: Final = frozenset((b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS"))
# Request headers that make a request unusual (framing, protocol switches, 100-continue).
_UNUSUAL: Final = frozenset((b"transfer-encoding", b"expect", b"upgrade"))
# Response headers h11 reorders, rewrites or frames by.
_FRAMING: Final = frozenset((b"content-length", b"transfer-encoding", b"connection", b"host"))
_FIRST: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class Request:
    """A plain request head: the fields of :class:`h11.Request` the server reads, and more.

    ``headers`` are (lower-cased name, value) pairs, as iterating an h11 request's headers
    gives them; ``length`` is the body's length; ``keep_alive`` is False when the client asked
    to close; ``head`` is the head's bytes (without its blank line), so h11 can be shown the
    same request when an answer needs it.
    """

    __slots__ = ("head", "headers", "keep_alive", "length", "method", "target")

    http_version: Final = b"1.1"

    def __init__(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        length: int,
        keep_alive: bool,
        head: bytes,
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.length = length
        self.keep_alive = keep_alive
        self.head = head


def parse_request(buffer: bytearray, limit: int) -> Request | int:
    """The plain request at the start of ``buffer`` (its head then removed from ``buffer``),
    :data:`NEED_DATA` or :data:`DECLINED`.

    ``limit`` is h11's ``max_incomplete_event_size``: an incomplete head longer than that is
    declined, and h11 answers it 431 as it does today.
    """
    if buffer[0] not in _FIRST:
        return DECLINED
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        # h11 ends a head at LF LF too: a bare LF anywhere is h11's to judge.
        if len(buffer) > limit or buffer.count(b"\n") != buffer.count(b"\r\n"):
            return DECLINED
        return NEED_DATA
    head = bytes(buffer[:end])
    line_end = head.find(b"\r\n")
    if line_end < 0:
        return DECLINED  # no headers, so no Host
    parts = head[:line_end].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] not in _METHODS:
        return DECLINED
    method, target, _ = parts
    # One pass checks every header line (and that no CR or LF stands anywhere else).
    if _TARGET.fullmatch(target) is None or _FIELDS.fullmatch(head, line_end) is None:
        return DECLINED
    headers = []
    hosts = 0
    length = -1
    keep_alive = True
    for line in head[line_end + 2 :].split(b"\r\n"):
        name, _, value = line.partition(b":")
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            if length >= 0 or _LENGTH.fullmatch(value) is None:
                return DECLINED
            length = int(value)
        elif name == b"connection":
            if b"close" in [item.strip() for item in value.lower().split(b",")]:
                keep_alive = False
        elif name in _UNUSUAL:
            return DECLINED
        headers.append((name, value))
    if hosts != 1:
        return DECLINED
    del buffer[: end + 4]
    return Request(method, target, headers, max(length, 0), keep_alive, head)
