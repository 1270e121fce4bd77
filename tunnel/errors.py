"""Typed errors of the tunnel package. Every message is one line that says what to do."""

from __future__ import annotations


class TunnelError(Exception):
    """Base class of every error this package raises on purpose."""


class TunnelConfigError(TunnelError):
    """The tunnel flags (``--tunnel``, ``--advertise-url``, ``--listener-port``) are unusable."""


class CloudflaredNotFound(TunnelError):
    """No cloudflared binary could be found (and downloading it was not allowed or failed)."""


class TunnelStartError(TunnelError):
    """cloudflared did not come up: it exited, published no URL, or never became reachable."""


class TunnelRateLimited(TunnelStartError):
    """Cloudflare refused to create another quick tunnel for this network (HTTP 429)."""


class TunnelRecordError(TunnelError):
    """The tunnel's :class:`~tunnel.owner.ChildOwner` could not record a cloudflared."""
