"""Reading cloudflared's stderr: the public URL, registration, rate limiting, metrics address.

Pure functions over one decoded line each, so the parsing rules are tested without a process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The quick-tunnel hostname. The character after the host must not continue a hostname, so
#: ``https://x.trycloudflare.com.evil.net`` is not taken for a tunnel.
_URL = re.compile(r"https://([a-z0-9-]+)\.trycloudflare\.com(?![A-Za-z0-9.-])")
#: Hosts of Cloudflare's own quick-tunnel API, which appear in error lines, never as a tunnel.
_API_HOSTS = frozenset({"api"})

REGISTRATION_MARKER = "Registered tunnel connection"
RATE_LIMIT_MARKERS = (
    "429 Too Many Requests",
    "error code: 1015",
    "failed to unmarshal quick Tunnel",
)

_METRICS = re.compile(r"Starting metrics server on (\S+?)/metrics")


@dataclass(frozen=True)
class StderrEvent:
    """What one stderr line tells the supervisor (all fields empty for an ordinary line)."""

    url: str | None = None
    registered: bool = False
    rate_limited: bool = False
    metrics_address: str | None = None


def parse_stderr_line(line: str) -> StderrEvent:
    """Classify one cloudflared stderr line.

    A rate-limit marker wins over a URL on the same line: error lines quote Cloudflare's API URL.
    """
    if any(marker in line for marker in RATE_LIMIT_MARKERS):
        return StderrEvent(rate_limited=True)
    if REGISTRATION_MARKER in line:
        return StderrEvent(registered=True)
    metrics = _METRICS.search(line)
    if metrics is not None:
        return StderrEvent(metrics_address=metrics.group(1))
    return StderrEvent(url=find_tunnel_url(line))


def find_tunnel_url(line: str) -> str | None:
    """The first ``https://<name>.trycloudflare.com`` quick-tunnel URL in ``line``, if any."""
    for match in _URL.finditer(line):
        if match.group(1) not in _API_HOSTS:
            return match.group(0)
    return None


def ready_url(metrics_address: str) -> str | None:
    """The ``/ready`` URL of cloudflared's metrics server, when it listens on loopback."""
    host, _, port = metrics_address.rpartition(":")
    if not port.isdigit() or host not in ("127.0.0.1", "localhost", "[::1]"):
        return None
    return f"http://{host}:{port}/ready"
