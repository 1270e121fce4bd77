"""The checks that cost milliseconds, run before the slow start-up steps (``uv sync``, the
rollout server, the model probe): a run that cannot work says why at once.

The config and the dataset are checked while the run is prepared (:mod:`launcher.prepare`);
these need the run's environment (the secrets file's provider keys are in it by then):

- the model and its key: a direct-path model (``openai/...``, ``openrouter/...``, ...) whose
  key variable is unset, and a provider key that is not ASCII or holds a control character (a
  line break), fail here, with the preflight's own message;
- cloudflared, when the run is told to use a managed tunnel (``--tunnel cloudflared`` or
  ``--cloudflared PATH``) without ``--download-cloudflared``: the binary must be there;
- ``--advertise-url``: its host must resolve (the listener it points at does not run yet, so
  this is as far as reachability can be checked before the run), unless it is a container
  engine's host alias (``host.containers.internal``...), which only a sandbox resolves;
- ``--ray ADDRESS``: something must answer TCP there (Ray's own connect loop takes minutes to
  give up: :mod:`launcher.cluster.join`), so a wrong host or port fails before ``uv sync``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio

from launcher.errors import LocalEvalError

if TYPE_CHECKING:
    from launcher.prepare import Prepared

__all__ = [
    "RESOLVE_TIMEOUT_S",
    "check_advertise_host",
    "check_cloudflared",
    "check_model_key",
    "check_ray_address",
    "early_checks",
]

#: How long the advertise URL's host may take to resolve.
RESOLVE_TIMEOUT_S = 10.0
#: Names a container engine resolves inside its containers only (for a sandbox reaching this
#: machine): this machine cannot resolve them, and the sandbox probe judges them instead.
SANDBOX_HOST_ALIASES = frozenset(
    {"host.containers.internal", "host.docker.internal", "gateway.docker.internal"}
)


async def early_checks(prepared: Prepared) -> None:
    """Every check below, for the prepared run; the first failure raises."""
    check_model_key(prepared.config.experiment.model_path, prepared.redactor)
    check_cloudflared(
        prepared.tunnel_plan.forced is not None,
        prepared.options.cloudflared,
        prepared.options.download_cloudflared,
    )
    await check_advertise_host(prepared.tunnel_plan.advertise_url)
    await check_ray_address(prepared.ray.address if prepared.ray is not None else None)


def check_model_key(model: str, redact: Callable[[str], str]) -> None:
    """Raise :class:`LocalEvalError` when ``model`` cannot be called with this environment:
    a name that names no model, a direct-path model without its key, or a provider key no
    request can carry (not ASCII, or holding a line break or other control character)."""
    from bridge.errors import UpstreamError
    from bridge.preflight import unsendable_credential
    from bridge.upstreams.routing import model_problem, path_kind, resolve_direct

    bad = model_problem(model) or unsendable_credential(model, os.environ)
    if bad is not None:
        raise LocalEvalError(f"model preflight failed for '{model}': {bad}")
    if path_kind(model) != "direct":
        return  # the echo model needs nothing; LiteLLM's providers are probed by the preflight
    try:
        resolve_direct(model)
    except UpstreamError as exc:
        kind = getattr(exc, "kind", None) or "AuthenticationError"
        raise LocalEvalError(
            f"model preflight failed for '{model}': {kind}: {redact(exc.message)}"
        ) from None


def check_cloudflared(forced: bool, explicit: str | None, download: bool) -> None:
    """Raise :class:`LocalEvalError` when a managed tunnel is asked for and no cloudflared
    binary is there (and no download is allowed)."""
    if download or not (forced or explicit):
        return
    from tunnel.errors import CloudflaredNotFound
    from tunnel.locate import locate_cloudflared

    try:
        locate_cloudflared(Path(explicit) if explicit else None)
    except CloudflaredNotFound as exc:
        raise LocalEvalError(str(exc)) from None


async def check_ray_address(address: str | None) -> None:
    """Raise :class:`LocalEvalError` when nothing answers TCP at ``--ray``'s address, or
    another service than a Ray head does."""
    if not address or address == "local":
        return
    from launcher.cluster.join import node_ip, unreachable

    why = await unreachable(address, node_ip)
    if why:
        raise LocalEvalError(f"could not join the Ray cluster at {address}: {why}")


async def check_advertise_host(url: str | None) -> None:
    """Raise :class:`LocalEvalError` when ``--advertise-url``'s host does not resolve."""
    if not url:
        return
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise LocalEvalError(f"--advertise-url {url} has no host; give a URL like https://host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise LocalEvalError(f"--advertise-url {url} has an invalid port") from None
    if host.lower() in SANDBOX_HOST_ALIASES:
        return
    with trio.move_on_after(RESOLVE_TIMEOUT_S) as waited:
        try:
            await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        except OSError as exc:
            raise LocalEvalError(
                f"--advertise-url {url}: its host {host} does not resolve ({exc.strerror or exc}); "
                "check the URL, or drop the option to let rollbridge choose"
            ) from None
    if waited.cancelled_caught:
        raise LocalEvalError(
            f"--advertise-url {url}: resolving {host} took over {RESOLVE_TIMEOUT_S:.0f} s; "
            "check the URL and this machine's DNS"
        )
