"""Public reachability for the bridge: cloudflared quick tunnels and advertised URLs.

Typical use by the supervisor::

    plan = validate_tunnel_flags(tunnel, advertise_url, listener_port)      # before anything
    ...
    decision = choose_tunnel(plan, requires_public_url=health.requires_public_url,
                             environment=health.chat_environment)   # after /health
    if decision.mode == "managed":
        binary = locate_cloudflared(explicit_path, allow_download=False)
        options = TunnelOptions(binary, bridge_port, owner=..., log=..., milestone=..., redact=...)
        handle = await nursery.start(run_cloudflared_tunnel, options)
        base = await handle.wait_available()     # at each dispatch: changes after a restart
        reason = await handle.wait_failed()      # in a watcher task: halt dispatch with it
        handle.stop(); await handle.wait_closed()  # teardown

``owner`` is a :class:`ChildOwner`: the caller's record of each cloudflared process, so that an
orphan left behind by a killed caller can be reaped later (the launcher passes one that writes
``tunnel.json``). This package imports nothing from ``launcher``, ``bridge`` or
``rollout_server``.
"""

from typing import TYPE_CHECKING, Any

from tunnel.errors import (
    CloudflaredNotFound,
    TunnelConfigError,
    TunnelError,
    TunnelRateLimited,
    TunnelRecordError,
    TunnelStartError,
)
from tunnel.locate import CLOUDFLARED_PATH_FLAG, DOWNLOAD_FLAG, locate_cloudflared
from tunnel.parse import find_tunnel_url, parse_stderr_line
from tunnel.plan import (
    INSECURE_ADVERTISE_URL,
    TunnelDecision,
    TunnelPlan,
    TunnelWarning,
    choose_tunnel,
    validate_tunnel_flags,
)

if TYPE_CHECKING:
    from tunnel.cloudflared import (
        RATE_LIMIT_MESSAGE,
        TunnelFailed,
        TunnelHandle,
        TunnelOptions,
        run_cloudflared_tunnel,
    )
    from tunnel.owner import ChildOwner, LogSink

# The process side pulls in httpx; importing it lazily keeps ``import tunnel.plan``
# (flag validation at CLI start-up) cheap.
_LAZY = {
    "RATE_LIMIT_MESSAGE": "tunnel.cloudflared",
    "ChildOwner": "tunnel.owner",
    "LogSink": "tunnel.owner",
    "TunnelFailed": "tunnel.cloudflared",
    "TunnelHandle": "tunnel.cloudflared",
    "TunnelOptions": "tunnel.cloudflared",
    "run_cloudflared_tunnel": "tunnel.cloudflared",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tunnel' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "CLOUDFLARED_PATH_FLAG",
    "DOWNLOAD_FLAG",
    "INSECURE_ADVERTISE_URL",
    "RATE_LIMIT_MESSAGE",
    "ChildOwner",
    "CloudflaredNotFound",
    "LogSink",
    "TunnelConfigError",
    "TunnelDecision",
    "TunnelError",
    "TunnelFailed",
    "TunnelHandle",
    "TunnelOptions",
    "TunnelPlan",
    "TunnelRateLimited",
    "TunnelRecordError",
    "TunnelStartError",
    "TunnelWarning",
    "choose_tunnel",
    "find_tunnel_url",
    "locate_cloudflared",
    "parse_stderr_line",
    "run_cloudflared_tunnel",
    "validate_tunnel_flags",
]
