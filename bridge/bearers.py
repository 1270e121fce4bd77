"""Which bearer the bridge accepts for a request: the run's, or one derived for its rollout.

A run's rollouts all reach the bridge with a bearer, and under a rollout's own URL
(``/v1/rollouts/<id>/…``) the bridge counts the call to ``<id>``. With one bearer for the whole
run, code holding it (an agent in a sandbox) could call under an id the supervisor never issued:
calls the run would not record, under an id no revocation covers. With per-rollout bearers
(:attr:`bridge.server.BridgeConfig.per_rollout_bearers`, what ``eval run`` uses) each rollout
gets ``rollout_bearer(token, id)``, an HMAC of its id under the run's token, and a rollout URL
accepts only its own: no id can be made up, and nothing is told to the bridge per rollout (the
bridge derives the same value). Routes outside a rollout's URL (the daemon's plain routes)
keep the run's token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from functools import lru_cache

__all__ = ["PREFIX", "Bearers", "rollout_bearer"]

#: Every per-rollout bearer starts so (a redactor finds them by it: bridge.scrub).
PREFIX = "rbk-"
_ROLLOUT = re.compile(r"/v1/rollouts/([^/]+)/")


@lru_cache(maxsize=4096)
def rollout_bearer(token: str, rollout_id: str) -> str:
    """The bearer of ``rollout_id`` in the run whose token is ``token`` (kept for the ids in
    use: each call of a rollout is checked twice, at the door and by its route)."""
    digest = hmac.new(token.encode(), rollout_id.encode(), hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class Bearers:
    """The bearer a request must present, by its (decoded) path."""

    __slots__ = ("per_rollout", "token")

    def __init__(self, token: str, *, per_rollout: bool = False) -> None:
        self.token = token
        self.per_rollout = per_rollout

    def expected(self, path: str) -> str:
        """The rollout's own bearer under a rollout's URL (per-rollout mode), else the run's."""
        if self.per_rollout:
            found = _ROLLOUT.match(path)
            if found is not None:
                return rollout_bearer(self.token, found.group(1))
        return self.token
