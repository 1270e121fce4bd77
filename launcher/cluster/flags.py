"""Checking ``--ray`` before anything starts (Ray itself is imported only by the run)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from launcher.errors import DependencyError, ValidationError

__all__ = ["check_ray_flag"]


def check_ray_flag(address: str, environ: Mapping[str, str]) -> None:
    """Refuse ``--ray`` without Ray installed, and a cluster joined without token auth.

    Anybody who reaches an unauthenticated Ray cluster's ports can run code on it, and Ray
    2.60 turns token auth on for a multi-node cluster only when a token is configured: the
    supervisor asks for ``RAY_AUTH_MODE=token`` (with ``RAY_AUTH_TOKEN`` or
    ``RAY_AUTH_TOKEN_PATH``) unless the user opts out with ``RAY_AUTH_MODE=disabled`` on a
    network they trust."""
    if not address.strip():
        raise ValidationError("--ray needs a cluster address (host:port) or 'local'")
    if importlib.util.find_spec("ray") is None:
        raise DependencyError(
            "--ray needs Ray: install rollbridge[ray] (pip install 'rollbridge[ray]')"
        )
    if address == "local":
        return
    mode = environ.get("RAY_AUTH_MODE", "")
    if mode == "disabled":
        return
    if mode != "token" or not (environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH")):
        raise ValidationError(
            "--ray with a cluster address needs Ray token authentication: set RAY_AUTH_MODE=token "
            "and RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) as the cluster's nodes have them, or "
            "RAY_AUTH_MODE=disabled on a network you trust"
        )
