"""Polling lease tokens (docs/spec/protocol.md §6): made from the OS CSPRNG, stored as digests."""

from __future__ import annotations

import base64
import hashlib
import secrets

__all__ = ["TokenSource", "digest"]


class TokenSource:
    """Lease tokens: 32 bytes from the OS CSPRNG each, URL-safe base64 (43 characters).

    The randomness is fetched 64 tokens at a time: one ``getrandom`` call per token cost
    more than the rest of an admission on this kind of machine.
    """

    _BATCH = 64

    def __init__(self) -> None:
        self._pool = b""
        self._offset = 0

    def next(self) -> str:
        """A fresh token."""
        if self._offset >= len(self._pool):
            self._pool = secrets.token_bytes(32 * self._BATCH)
            self._offset = 0
        chunk = self._pool[self._offset : self._offset + 32]
        self._offset += 32
        return base64.urlsafe_b64encode(chunk).rstrip(b"=").decode("ascii")


def digest(token: str) -> bytes:
    """What is stored of a token (and compared, in constant time)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
