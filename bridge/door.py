"""The bridge's door: route, method, token and declared size checked from the request head.

The bridge can be reached from the internet (a cloudflared tunnel), so nothing of a request
body is read before the request is known to be for a route the bridge serves, by a caller who
holds its token, and within that route's body cap. The checks run on the head alone; a refusal
is answered with ``Connection: close`` (when a body was announced), and the lean loop never
drains an unread body (:mod:`rollout_server.net.limits`), so a refused body is not read.

The routes are a table (:class:`Route`): a route is served by adding an entry, and the door
then admits it with the same checks. The token check accepts ``Authorization: Bearer <token>``
(scheme case-insensitive, as :func:`bridge.policy.check_auth`) and ``x-api-key: <token>`` (the
spelling Anthropic's clients send); a route's handler may insist on one of them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from bridge.bearers import Bearers
from bridge.codec import dumps
from bridge.policy import check_auth
from bridge.probe import PROBE_PREFIX
from rollout_server.net.asgi import header

if TYPE_CHECKING:
    from rollout_server.net.asgi import HTTPScope

__all__ = [
    "GET_BODY_CAP",
    "Door",
    "Refusal",
    "Route",
    "announces_body",
    "bridge_routes",
    "token_matches",
]

GET_BODY_CAP: Final = 64 * 1024
"""The body cap of routes that take no body (a client may still send a small one)."""

_GET: Final = frozenset({"GET", "HEAD"})


@dataclass(frozen=True, slots=True)
class Route:
    """One path the bridge serves: a full-match pattern on the decoded path, the methods it
    answers (others get 405), whether it needs the token, and its body cap (``None``: the
    bridge's ``max_body``)."""

    pattern: re.Pattern[str]
    methods: frozenset[str]
    needs_token: bool = True
    max_body: int | None = None

    @classmethod
    def post(cls, pattern: str, *, needs_token: bool = True) -> Route:
        """A POST route capped at the bridge's ``max_body``."""
        return cls(re.compile(pattern), frozenset({"POST"}), needs_token)

    @classmethod
    def get(cls, pattern: str, *, needs_token: bool = True) -> Route:
        """A GET (and HEAD) route capped at :data:`GET_BODY_CAP`."""
        return cls(re.compile(pattern), _GET, needs_token, GET_BODY_CAP)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The answer the door gives instead of admitting a request."""

    status: int
    body: bytes
    close: bool


def token_matches(scope: HTTPScope, token: str) -> bool:
    """The request carries ``token`` as ``Authorization: Bearer`` or as ``x-api-key``."""
    authorization = header(scope, b"authorization")
    if authorization is not None and check_auth(authorization.decode("latin-1"), token):
        return True
    api_key = header(scope, b"x-api-key")
    return api_key is not None and secrets.compare_digest(api_key, token.encode("utf-8"))


def announces_body(scope: HTTPScope) -> bool:
    """The request head announces a body (a refusal without reading it must close)."""
    if header(scope, b"transfer-encoding") is not None:
        return True
    length = header(scope, b"content-length")
    return length is not None and length.strip(b" \t") != b"0"


def _declared(scope: HTTPScope) -> int | None:
    length = header(scope, b"content-length")
    if length is None or not length.isdigit():
        return None
    return int(length)


class Door:
    """Admits a request to one of ``routes`` or says how to refuse it, from the head only.

    The order of the checks is the order the bridge has always answered in: unknown path 404,
    other method 405, missing or wrong token 401, declared body over the cap 413.
    """

    def __init__(self, routes: Iterable[Route], *, bearers: Bearers, max_body: int) -> None:
        self.routes = tuple(routes)
        self.bearers = bearers
        self.max_body = max_body

    def check(self, scope: HTTPScope) -> Refusal | None:
        """``None`` to admit the request, else the refusal to send."""
        path: str = scope["path"]
        route = next((r for r in self.routes if r.pattern.fullmatch(path)), None)
        if route is None:
            return self._refuse(scope, 404, "Not Found")
        if scope["method"] not in route.methods:
            return self._refuse(scope, 405, "Method Not Allowed")
        if route.needs_token and not token_matches(scope, self.bearers.expected(path)):
            return self._refuse(scope, 401, "Unauthorized")
        cap = self.max_body if route.max_body is None else route.max_body
        declared = _declared(scope)
        if declared is not None and declared > cap:
            return Refusal(413, dumps({"detail": "Request Entity Too Large"}), True)
        return None

    def cap(self, scope: HTTPScope) -> int:
        """The body cap of the (admitted) request's route."""
        path: str = scope["path"]
        for route in self.routes:
            if route.pattern.fullmatch(path):
                return self.max_body if route.max_body is None else route.max_body
        return self.max_body

    @staticmethod
    def _refuse(scope: HTTPScope, status: int, detail: str) -> Refusal:
        return Refusal(status, dumps({"detail": detail}), announces_body(scope))


def bridge_routes(*, plain_chat_route: bool, probe: bool) -> list[Route]:
    """The routes a bridge serves (:func:`bridge.app.create_app`); a new route is one entry."""
    routes = [
        Route.post(r"/v1/rollouts/[^/]+/chat/completions"),
        # What OpenAI and Anthropic clients ask besides a call: the model list, and the stored
        # responses this stateless bridge does not keep (bridge.fallback answers both).
        Route.get(r"/v1/rollouts/[^/]+(?:/v1)?/models"),
        Route(
            re.compile(r"/v1/rollouts/[^/]+/responses/[^/]+(?:/cancel|/input_items)?"),
            frozenset({"GET", "HEAD", "POST", "DELETE"}),
            max_body=GET_BODY_CAP,
        ),
    ]
    if plain_chat_route:
        routes += [
            Route.post(r"/v1/chat/completions"),
            Route.get(r"/health", needs_token=False),
            Route.get(r"/v1/models"),
            Route.get(r"/v1/usage"),
        ]
    if probe:
        # No token: bridge.probe says why.
        routes.append(Route.get(re.escape(PROBE_PREFIX) + r"[^/]+", needs_token=False))
    return routes
