"""The door of the daemon's loopback HTTP listener: the bearer token, an exact ``Host``, the
browser origins allowed to call it (CORS), checked before a route or a body is read.

On the unix socket the kernel already proved the peer, so :class:`HttpGuard` is used only on
``--http``. docs/daemon.md describes what each refusal answers.
"""

from __future__ import annotations

import secrets as _secrets
from dataclasses import dataclass
from typing import Any

from launcher.daemon.registry import ApiError
from rollout_server.net.asgi import ASGISendCallable, HTTPScope, header

__all__ = ["HttpGuard", "with_headers"]

_CORS_METHODS = b"GET, POST, DELETE"
_CORS_HEADERS = b"authorization, content-type, last-event-id"


@dataclass(frozen=True)
class HttpGuard:
    """The loopback HTTP listener's checks: bearer token, exact Host, own Origin for writes.

    ``origins`` are the browser origins given with ``--allow-origin`` (an exact origin, or
    ``scheme://*`` for every origin of a scheme, as VS Code's webviews have one each): their
    CORS preflight is answered and their answers carry ``Access-Control-Allow-Origin``, so a
    page holding the token can call the API. The token is still required of them.
    """

    token: str
    port: int
    origins: frozenset[bytes] = frozenset()

    @property
    def hosts(self) -> frozenset[bytes]:
        """The accepted ``Host`` values."""
        return frozenset({f"127.0.0.1:{self.port}".encode(), f"localhost:{self.port}".encode()})

    def allowed_origin(self, origin: bytes | None) -> bool:
        """Whether ``origin`` is one given with ``--allow-origin`` (the daemon's own is not
        cross-origin and needs no CORS)."""
        if origin is None:
            return False
        scheme, sep, _ = origin.partition(b"://")
        return origin in self.origins or (bool(sep) and scheme + b"://*" in self.origins)

    def cors_headers(self, scope: HTTPScope) -> list[tuple[bytes, bytes]]:
        """``Access-Control-Allow-Origin`` for an allowed origin's request, else nothing."""
        origin = header(scope, b"origin")
        if origin is None or not self.allowed_origin(origin):
            return []
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]

    def preflight(self, scope: HTTPScope) -> list[tuple[bytes, bytes]] | None:
        """The headers answering a CORS preflight from an allowed origin (None: not one)."""
        if scope["method"] != "OPTIONS" or header(scope, b"access-control-request-method") is None:
            return None
        allowed = self.cors_headers(scope)
        if not allowed:
            return None
        return [
            *allowed,
            (b"access-control-allow-methods", _CORS_METHODS),
            (b"access-control-allow-headers", _CORS_HEADERS),
            (b"access-control-max-age", b"600"),
        ]

    def check(self, scope: HTTPScope) -> ApiError | None:
        """The refusal for this request, or None."""
        if header(scope, b"host") not in self.hosts:
            return ApiError(421, "HOST", "the Host header does not name this daemon")
        scheme, _, credentials = (header(scope, b"authorization") or b"").partition(b" ")
        # The scheme is case-insensitive (RFC 9110, section 11.1); exactly one space before the token.
        if scheme.lower() != b"bearer" or not _secrets.compare_digest(
            credentials, self.token.encode()
        ):
            return ApiError(401, "UNAUTHORIZED", "missing or wrong bearer token")
        origin = header(scope, b"origin")
        write = scope["method"] not in ("GET", "HEAD")
        own = {b"http://" + h for h in self.hosts}
        if write and origin is not None and origin not in own and not self.allowed_origin(origin):
            return ApiError(
                403,
                "ORIGIN",
                "cross-origin writes are refused (start the daemon with --allow-origin ORIGIN "
                "to let a page of that origin call it with the token)",
            )
        return None


def with_headers(send: ASGISendCallable, extra: list[tuple[bytes, bytes]]) -> ASGISendCallable:
    """``send`` adding ``extra`` to the response's headers."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending
