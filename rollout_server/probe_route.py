"""``POST /v1/rollbridge/probe-chat-endpoint``: the supervisor asks how a sandbox reaches the bridge.

An optional route (contract 5 of the Harbor issue; docs/harbor.md, section "Placement"). The
body is ``{nonce, expect, candidates: [{kind, url}], exclusive}``; it is checked here and handed,
normalised, to :meth:`~rollout_server.backend.ExecutionBackend.probe_chat_endpoint`. The backend
answers the probe report (``200``), or ``None`` when it has no probe (``404``: a LocalBackend,
a host-side agent, any backend written before the route existed). Bad input is ``400`` with a
one-line ``detail``; a backend that fails is ``500`` with its one-line reason.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final
from urllib.parse import urlsplit

from .backend import ExecutionBackend

__all__ = ["PROBE_ROUTE", "ProbeRequestError", "answer_probe", "parse_probe_request"]

logger = logging.getLogger("rollout_server")

PROBE_ROUTE: Final = "/v1/rollbridge/probe-chat-endpoint"

# The candidate kinds of rollout_server.harbor.route (not imported: rollout_server never loads
# the Harbor package on its own); a test keeps the two equal.
CANDIDATE_KINDS: Final = ("loopback", "slirp", "advertise", "relay", "tunnel")
_NONCE = re.compile(r"[A-Za-z0-9_-]{1,128}")
_MAX_CANDIDATES = 16


class ProbeRequestError(ValueError):
    """A probe request body that does not have the documented shape (one-line message)."""


def _url(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > 2048:
        raise ProbeRequestError(f"{where}.url must be a string of at most 2048 characters")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ProbeRequestError(f"{where}.url must be an http(s) base URL, got {value!r}")
    return value


def parse_probe_request(body: Any) -> dict[str, Any]:
    """The validated, normalised request; raises :class:`ProbeRequestError`."""
    if not isinstance(body, dict):
        raise ProbeRequestError("the body must be a JSON object")
    unknown = sorted(set(body) - {"nonce", "expect", "candidates", "exclusive"})
    if unknown:
        raise ProbeRequestError(f"unknown field(s): {', '.join(unknown)}")
    nonce = body.get("nonce")
    if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
        raise ProbeRequestError("nonce must be 1-128 characters of [A-Za-z0-9_-]")
    expect = body.get("expect")
    if expect is not None and (not isinstance(expect, str) or not 0 < len(expect) <= 256):
        raise ProbeRequestError("expect must be a non-empty string (or null)")
    exclusive = body.get("exclusive", False)
    if not isinstance(exclusive, bool):
        raise ProbeRequestError("exclusive must be true or false")
    candidates = body.get("candidates")
    if not isinstance(candidates, list) or not 0 < len(candidates) <= _MAX_CANDIDATES:
        raise ProbeRequestError(f"candidates must be a list of 1 to {_MAX_CANDIDATES} objects")
    parsed = []
    for index, candidate in enumerate(candidates):
        where = f"candidates[{index}]"
        if not isinstance(candidate, dict) or set(candidate) != {"kind", "url"}:
            raise ProbeRequestError(f"{where} must be an object with exactly kind and url")
        if candidate["kind"] not in CANDIDATE_KINDS:
            raise ProbeRequestError(f"{where}.kind must be one of {', '.join(CANDIDATE_KINDS)}")
        parsed.append({"kind": candidate["kind"], "url": _url(candidate["url"], where)})
    return {"nonce": nonce, "expect": expect, "candidates": parsed, "exclusive": exclusive}


async def answer_probe(backend: ExecutionBackend, body: Any) -> tuple[int, Any]:
    """The status and JSON payload answering one probe request."""
    try:
        request = parse_probe_request(body)
    except ProbeRequestError as exc:
        return 400, {"detail": str(exc)}
    try:
        report = await backend.probe_chat_endpoint(request)
    except Exception as exc:
        logger.exception("the sandbox probe failed")
        line = " ".join(str(exc).split()) or type(exc).__name__
        return 500, {"detail": f"the sandbox probe failed: {line[:500]}"}
    if report is None:
        return 404, {"detail": "this rollout server has no sandbox probe"}
    return 200, report
