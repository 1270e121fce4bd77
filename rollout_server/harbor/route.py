"""How an in-sandbox agent reaches this run's bridge: the shared vocabulary of the probe.

A *candidate* is one way a sandbox might reach the bridge; the probe (``probe.py``) tries
candidates from inside a sandbox of the same placement and returns a :class:`ProbeReport`; the
chosen candidate becomes the backend's :class:`SandboxRoute`, which decides, per trial, the
compose network overlay, the base URL the container is given, and whether the exec relay runs.

Kinds, in the order the automatic ladder tries them:

``loopback``
    The bridge's own ``http://127.0.0.1:<port>``: only works where the sandbox shares the
    host's network namespace.
``slirp``
    ``http://10.0.2.2:<port>`` with the trial's main service on
    ``slirp4netns:allow_host_loopback=true``: the bridge stays bound to 127.0.0.1.
``advertise``
    The user's ``--advertise-url``; when given, it is the only candidate (the user chose it).
``relay``
    The exec relay: a stdlib relay listens on ``127.0.0.1:13131`` inside the container and
    carries connections over one ``podman exec -i`` pipe to the loopback bridge. Works with no
    network at all.
``tunnel``
    The managed cloudflared tunnel's public URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CANDIDATE_KINDS",
    "PROBE_OUTCOMES",
    "RELAY_PORT",
    "SLIRP_HOST",
    "SLIRP_NETWORK_MODE",
    "Candidate",
    "ProbeAttempt",
    "ProbeReport",
    "SandboxRoute",
]

CandidateKind = Literal["loopback", "slirp", "advertise", "relay", "tunnel"]
CANDIDATE_KINDS: tuple[CandidateKind, ...] = ("loopback", "slirp", "advertise", "relay", "tunnel")

#: ``reached``: the bridge answered the nonce. The others are typed failures.
ProbeOutcome = Literal[
    "reached", "dns", "refused", "timeout", "unreachable", "wrong_server", "error"
]
PROBE_OUTCOMES: tuple[ProbeOutcome, ...] = (
    "reached",
    "dns",
    "refused",
    "timeout",
    "unreachable",
    "wrong_server",
    "error",
)

#: The address the container's relay listens on (inside the container's own loopback).
RELAY_PORT = 13131
#: slirp4netns's alias for the host's loopback (only with ``allow_host_loopback=true``).
SLIRP_HOST = "10.0.2.2"
SLIRP_NETWORK_MODE = "slirp4netns:allow_host_loopback=true"


@dataclass(frozen=True)
class Candidate:
    """One way to reach the bridge: ``url`` is the base URL as the sandbox would dial it."""

    kind: CandidateKind
    url: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url}


@dataclass(frozen=True)
class ProbeAttempt:
    """The evidence of one candidate tried from inside a sandbox."""

    candidate: Candidate
    outcome: ProbeOutcome
    detail: str
    elapsed_ms: float

    def to_json(self) -> dict[str, Any]:
        return {
            **self.candidate.to_json(),
            "outcome": self.outcome,
            "detail": self.detail,
            "elapsed_ms": round(self.elapsed_ms, 1),
        }


@dataclass(frozen=True)
class SandboxRoute:
    """The chosen way in: what a trial's container is given.

    ``base_url`` is what the container dials (the rollout path is appended);
    ``network_mode`` is the compose ``network_mode`` of the trial's main service (``None``:
    leave the task's network alone); ``relay_target`` is the host ``(host, port)`` the exec
    relay forwards to when ``kind == "relay"``.
    """

    kind: CandidateKind
    base_url: str
    network_mode: str | None = None
    relay_target: tuple[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "url": self.base_url}
        if self.network_mode is not None:
            out["network_mode"] = self.network_mode
        if self.relay_target is not None:
            out["relay_target"] = f"{self.relay_target[0]}:{self.relay_target[1]}"
        return out


@dataclass(frozen=True)
class ProbeReport:
    """Every candidate tried, in order, and the route chosen (``None``: none reached)."""

    attempts: tuple[ProbeAttempt, ...]
    route: SandboxRoute | None
    placement: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "reachable": self.route.base_url if self.route is not None else None,
            "route": self.route.to_json() if self.route is not None else None,
            "placement": dict(self.placement),
            "evidence": [a.to_json() for a in self.attempts],
        }
