"""Public reachability for the bridge: cloudflared quick tunnels and advertised URLs.

Typical use by the supervisor::

    plan = validate_tunnel_flags(tunnel, advertise_url, listener_port)      # before anything
    ...
    decision = choose_tunnel(plan, health)                                   # after /health
    if decision.mode == "managed":
        binary = locate_cloudflared(explicit_path, allow_download=False)
        options = TunnelOptions(binary, bridge_port, run_dir, log=..., milestone=..., redact=...)
        handle = await nursery.start(run_cloudflared_tunnel, options)
        base = await handle.wait_available()     # at each dispatch: changes after a restart
        reason = await handle.wait_failed()      # in a watcher task: halt dispatch with it
        handle.stop(); await handle.wait_closed()  # teardown

This package imports nothing from ``launcher``, ``bridge`` or ``rollout_server``.
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
    public_chat_endpoint_environment,
    validate_tunnel_flags,
)

if TYPE_CHECKING:
    from tunnel.cloudflared import (
        RATE_LIMIT_MESSAGE,
        LogSink,
        TunnelFailed,
        TunnelHandle,
        TunnelOptions,
        run_cloudflared_tunnel,
    )
    from tunnel.record import (
        TUNNEL_RECORD,
        ProcessRecord,
        ReapedTunnel,
        read_start_token,
        reap_orphan_tunnel,
    )

# The process side pulls in httpx and psutil; importing it lazily keeps ``import tunnel.plan``
# (flag validation at CLI start-up) cheap.
_LAZY = {
    "RATE_LIMIT_MESSAGE": "tunnel.cloudflared",
    "LogSink": "tunnel.cloudflared",
    "TunnelFailed": "tunnel.cloudflared",
    "TunnelHandle": "tunnel.cloudflared",
    "TunnelOptions": "tunnel.cloudflared",
    "run_cloudflared_tunnel": "tunnel.cloudflared",
    "TUNNEL_RECORD": "tunnel.record",
    "ProcessRecord": "tunnel.record",
    "ReapedTunnel": "tunnel.record",
    "read_start_token": "tunnel.record",
    "reap_orphan_tunnel": "tunnel.record",
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
    "TUNNEL_RECORD",
    "CloudflaredNotFound",
    "LogSink",
    "ProcessRecord",
    "ReapedTunnel",
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
    "public_chat_endpoint_environment",
    "read_start_token",
    "reap_orphan_tunnel",
    "run_cloudflared_tunnel",
    "validate_tunnel_flags",
]
