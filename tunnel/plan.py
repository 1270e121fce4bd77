"""Which way the bridge is made reachable: flag validation and the decision from ``/health``.

Pure logic apart from one bind probe of ``--listener-port``; the supervisor calls
:func:`validate_tunnel_flags` before anything starts and :func:`choose_tunnel` once the rollout
server's health report is known (the caller reads that report; this package takes plain
values and imports nothing else of the project).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

from tunnel.errors import TunnelConfigError

#: The only managed tunnel provider.
CLOUDFLARED: Final = "cloudflared"

#: Warning code for an ``http://`` advertise URL that leaves this machine.
INSECURE_ADVERTISE_URL = "INSECURE_ADVERTISE_URL"

_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1"})


@dataclass(frozen=True)
class TunnelWarning:
    """A non-fatal finding about the flags, shown to the user with its code."""

    code: str
    message: str


@dataclass(frozen=True)
class TunnelPlan:
    """The validated tunnel flags.

    ``forced`` is the provider given with ``--tunnel`` (only ``"cloudflared"``), ``advertise_url``
    the user's own public base URL exactly as given, ``listener_port`` the fixed bridge port (None
    means ephemeral). ``warnings`` are to be printed before the plan table.
    """

    forced: Literal["cloudflared"] | None = None
    advertise_url: str | None = None
    listener_port: int | None = None
    warnings: tuple[TunnelWarning, ...] = ()

    @property
    def auto_detect(self) -> bool:
        """True when the health report decides (neither ``--tunnel`` nor ``--advertise-url``)."""
        return self.forced is None and self.advertise_url is None

    def resume_flags(self) -> list[str]:
        """The flags to append to every suggested follow-up command, in the reference order."""
        flags: list[str] = []
        if self.forced is not None:
            flags += ["--tunnel", self.forced]
        if self.advertise_url is not None:
            flags += ["--advertise-url", self.advertise_url]
        if self.listener_port is not None:
            flags += ["--listener-port", str(self.listener_port)]
        return flags


@dataclass(frozen=True)
class TunnelDecision:
    """How rollouts reach the bridge for this run.

    ``mode`` is ``"none"`` (rollouts use the loopback base), ``"managed"`` (start a cloudflared
    quick tunnel) or ``"advertise"`` (use ``advertise_url``, no process). ``environment`` is the
    sandbox label when the health report triggered the tunnel automatically.
    """

    mode: Literal["none", "managed", "advertise"]
    environment: str | None = None
    advertise_url: str | None = None

    @property
    def keepalive(self) -> bool:
        """Whether the bridge's non-stream keepalive must be on (the base is not loopback)."""
        return self.mode != "none"

    @property
    def milestone(self) -> str | None:
        """The stage line announcing the decision, or None when there is nothing to announce."""
        if self.mode == "managed" and self.environment is not None:
            return f"detected {self.environment} sandbox; enabling cloudflared automatically"
        if self.mode == "advertise":
            return f"advertising chat endpoint through {self.advertise_url}"
        return None


def validate_tunnel_flags(
    tunnel: str | None,
    advertise_url: str | None,
    listener_port: int | None,
    *,
    probe_port: bool = True,
) -> TunnelPlan:
    """Check the tunnel flags before anything starts and return the plan.

    Checks run in the reference order (provider, exclusivity, port range, URL shape, URL needs a
    port), then, with ``probe_port``, that ``127.0.0.1:<listener_port>`` can be bound right now.
    Raises :class:`TunnelConfigError` with a one-line message on the first problem.
    """
    if tunnel is not None and tunnel != CLOUDFLARED:
        raise TunnelConfigError(f"--tunnel supports only 'cloudflared', got '{tunnel}'")
    if tunnel is not None and advertise_url is not None:
        raise TunnelConfigError(
            "--tunnel and --advertise-url are mutually exclusive: --tunnel manages a tunnel "
            "for you, --advertise-url points at one you run."
        )
    if listener_port is not None and not 1 <= listener_port <= 65535:
        raise TunnelConfigError(f"--listener-port must be between 1 and 65535, got {listener_port}")
    warnings: list[TunnelWarning] = []
    if advertise_url is not None:
        scheme, host = _check_base_url(advertise_url)
        if listener_port is None:
            raise TunnelConfigError(
                "--advertise-url requires --listener-port: your tunnel needs a fixed local port "
                "to forward to."
            )
        if scheme == "http" and host not in _LOCAL_HOSTS:
            warnings.append(
                TunnelWarning(
                    INSECURE_ADVERTISE_URL,
                    "--advertise-url uses plain http: the per-run bridge bearer and all model "
                    "traffic cross the network unencrypted.",
                )
            )
    if listener_port is not None and probe_port:
        _check_port_free(listener_port)
    return TunnelPlan(
        forced=CLOUDFLARED if tunnel is not None else None,
        advertise_url=advertise_url,
        listener_port=listener_port,
        warnings=tuple(warnings),
    )


def _check_base_url(url: str) -> tuple[str, str]:
    message = (
        "--advertise-url must be an http(s) base URL with a host and no query or fragment, "
        f"got '{url}'"
    )
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a malformed port
    except ValueError:
        raise TunnelConfigError(message) from None
    # "?" or "#" with nothing after them still swallows the rollout path that gets appended.
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or "?" in url
        or "#" in url
        or any(ch.isspace() for ch in url)
    ):
        raise TunnelConfigError(message)
    return parts.scheme, parts.hostname


def _check_port_free(port: int) -> None:
    # Same socket options as the bridge listener, so a port in TIME_WAIT passes here and there.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        hint = (
            "another program is listening there; stop it or choose another --listener-port"
            if exc.errno == errno.EADDRINUSE
            else "choose another --listener-port"
        )
        raise TunnelConfigError(
            f"could not bind the LLM bridge on 127.0.0.1:{port}: {exc} ({hint})"
        ) from None
    finally:
        sock.close()


def choose_tunnel(
    plan: TunnelPlan, *, requires_public_url: bool | None, environment: str | None
) -> TunnelDecision:
    """Decide how rollouts reach the bridge: forced, advertised, automatic from health, or none.

    Automatic detection runs only when neither ``--tunnel`` nor ``--advertise-url`` was given,
    and only ``requires_public_url is True`` (the health report's ``chat_endpoint``) triggers
    it; the sandbox label is ``environment`` stripped, or ``"remote"`` when missing or blank.
    """
    if plan.advertise_url is not None:
        return TunnelDecision("advertise", advertise_url=plan.advertise_url)
    if plan.forced is not None:
        return TunnelDecision("managed")
    if requires_public_url is True:
        label = environment.strip() if environment is not None else ""
        return TunnelDecision("managed", environment=label or "remote")
    return TunnelDecision("none")
