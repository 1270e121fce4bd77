"""The common HTTP/1.1 request of :mod:`rollout_server.net.wire`, written without h11.

h11 builds and validates an event for every request: in the rollout client that was most of
the CPU its calls cost. Most requests are the same simple shape, which :func:`encode_request`
writes directly, byte for byte what h11 0.16 writes (``tests/rollout_server/net/test_wirefast.py``
holds it against h11 over generated requests): the request line, ``host`` first, the other
headers in order and as given, then the body. It returns ``None`` for anything it does not
vouch for: a name or value h11 would refuse (a name outside the token characters, a value
with control characters, line breaks or surrounding blanks, which also rules out header
injection), a method outside the common ones (``CONNECT`` switches protocols), and headers
that change framing or the connection's fate (``content-length``, ``transfer-encoding``,
``connection``, ``upgrade``, ``expect``, a second ``host``). Answers are read by httptools
(:class:`rollout_server.net.wire.Connection`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = ["CheckedHeaders", "encode_request"]

_TOKEN: Final = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_CONTENT: Final = rb"[^\x00\s]+(?:[ \t]+[^\x00\s]+)*"

_NAME = re.compile(_TOKEN)
_VALUE = re.compile(rb"(?:" + _CONTENT + rb")?")
_TARGET = re.compile(rb"[\x21-\x7e]+")

_METHODS: Final = frozenset((b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS"))
_OURS: Final = frozenset(
    (b"host", b"content-length", b"transfer-encoding", b"connection", b"upgrade", b"expect")
)


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
