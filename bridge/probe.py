"""The bridge's answer to a sandbox probe: ``GET /v1/rollbridge/probe/<nonce>``.

A sandbox that reaches this URL proves it reached *this run's* bridge, not merely some server
on that port: the answer is ``{"rollbridge_probe": hex(HMAC-SHA256(key, nonce))}`` with a key
drawn at random each time a bridge starts, which only the supervisor holding the
:class:`~bridge.server.BridgeHandle` can predict (:meth:`ProbeKey.answer`). The route needs no
bearer: the answer reveals nothing but that this bridge is up, and a probe must not carry the
run's secret into a sandbox before it is known to be the right place.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Final

__all__ = ["PROBE_PREFIX", "ProbeKey", "valid_nonce"]

PROBE_PREFIX: Final = "/v1/rollbridge/probe/"
_NONCE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def valid_nonce(nonce: str) -> bool:
    """A nonce is 1 to 128 characters of hex or URL-safe base64 (``A-Za-z0-9_-``)."""
    return _NONCE.fullmatch(nonce) is not None


class ProbeKey:
    """The per-start secret behind the probe answers."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def answer(self, nonce: str) -> str:
        """``hex(HMAC-SHA256(key, nonce))``; raises ``ValueError`` for an invalid nonce."""
        if not valid_nonce(nonce):
            raise ValueError("a probe nonce is 1-128 characters of [A-Za-z0-9_-]")
        return hmac.new(self._key, nonce.encode("ascii"), hashlib.sha256).hexdigest()
