"""Checking ``--ray`` before anything starts (Ray itself is imported only by the run)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

from launcher.config_ray import split_address
from launcher.errors import DependencyError, ValidationError

__all__ = [
    "DEADMAN_ENV",
    "DEADMAN_MIN_S",
    "DEADMAN_S",
    "check_ray_flag",
    "deadman_seconds",
    "ray_temp_dir",
    "this_machines_cluster",
    "without_ray_vars",
]

#: ``ROLLBRIDGE_RAY_DEADMAN_S``: how long a node agent goes without any call from its
#: supervisor (pings come every 2 s) before it stops its rollout server by itself (a partition
#: that does not heal); ``0`` turns the switch off.
DEADMAN_ENV = "ROLLBRIDGE_RAY_DEADMAN_S"
DEADMAN_S = 60.0
#: The shortest switch taken: five of the supervisor's pings (launcher.cluster.replicas.PING_S,
#: 2 s). A shorter one stopped healthy nodes' servers between two pings (a busy supervisor
#: answers late), losing every replica but the head's.
DEADMAN_MIN_S = 10.0


def deadman_seconds(environ: Mapping[str, str]) -> float:
    """:data:`DEADMAN_ENV`'s value (default :data:`DEADMAN_S`); a bad one is refused."""
    text = environ.get(DEADMAN_ENV, "").strip()
    if not text:
        return DEADMAN_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValidationError(
            f"{DEADMAN_ENV} must be a number of seconds (0 turns it off), not {text!r}"
        )
    if 0 < value < DEADMAN_MIN_S:
        raise ValidationError(
            f"{DEADMAN_ENV} must be at least {DEADMAN_MIN_S:g} seconds (five of the "
            f"supervisor's pings; 0 turns it off), not {text!r}"
        )
    return value


def check_ray_flag(address: str, environ: Mapping[str, str]) -> None:
    """Refuse ``--ray`` without Ray installed, and a cluster joined without token auth.

    Anybody who reaches an unauthenticated Ray cluster's ports can run code on it, and Ray
    2.60 turns token auth on for a multi-node cluster only when a token is configured: the
    supervisor asks for ``RAY_AUTH_MODE=token`` (with ``RAY_AUTH_TOKEN`` or
    ``RAY_AUTH_TOKEN_PATH``) unless the user opts out with ``RAY_AUTH_MODE=disabled`` on a
    network they trust."""
    if not address.strip():
        raise ValidationError("--ray needs a cluster address (host:port), 'local' or 'auto'")
    deadman_seconds(environ)
    if importlib.util.find_spec("ray") is None:
        raise DependencyError(
            "--ray needs Ray: install rollbridge[ray] (pip install 'rollbridge[ray]')"
        )
    if address == "local":
        return
    given = environ.get("RAY_AUTH_MODE", "")
    mode = given.lower()  # as Ray reads it
    if mode == "disabled":
        return
    if mode not in ("", "token"):
        # A typo is neither word: said as the problem, not as a missing setting.
        raise ValidationError(
            f"RAY_AUTH_MODE={given!r} is not a mode Ray knows: set RAY_AUTH_MODE=token (with "
            "RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN, as the cluster's nodes have them) or "
            "RAY_AUTH_MODE=disabled on a network you trust"
        )
    if mode != "token" or not (environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH")):
        raise ValidationError(
            "--ray with a cluster address needs Ray token authentication: set RAY_AUTH_MODE=token "
            "and RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) as the cluster's nodes have them, or "
            "RAY_AUTH_MODE=disabled on a network you trust"
        )


def without_ray_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without Ray's variables (``RAY_*``): the environment of what a run starts
    beside Ray (a rollout server on any node, uv building a node's environment), which has no
    use for the cluster's address or settings."""
    return {k: v for k, v in environ.items() if not k.startswith("RAY_")}


def ray_temp_dir(environ: Mapping[str, str]) -> Path:
    """Where Ray keeps this machine's sessions and ``ray_current_cluster``: Ray 2.60's rule
    (``RAY_TMPDIR``, else ``TMPDIR`` on Linux, else ``/tmp``, then ``ray``), restated so that
    neither a failed start's explanation nor ``--ray`` alone needs Ray's private modules."""
    base = environ.get("RAY_TMPDIR") or (environ.get("TMPDIR") if sys.platform == "linux" else None)
    return Path(base or "/tmp") / "ray"


def this_machines_cluster(environ: Mapping[str, str], via: str = "--ray without an address") -> str:
    """The address ``--ray`` alone (``auto``) means, as Ray finds it: ``RAY_ADDRESS``, else
    what ``ray start --head`` on this machine wrote to ``ray_current_cluster``. Resolved before
    the run (the header, the TCP check and the join all use the address itself); none is one
    line saying what to pass instead (``via``: how the user asked for it)."""
    given = environ.get("RAY_ADDRESS", "").strip()
    if given and given != "auto":
        if given != "local" and split_address(given) is None:
            raise ValidationError(
                f"{via} uses RAY_ADDRESS, which must be HOST:PORT "
                f"(e.g. 10.0.0.1:6379), got {given!r}"
            )
        return given
    current = ray_temp_dir(environ) / "ray_current_cluster"
    try:
        written = current.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        written = ""
    if split_address(written) is not None:
        return written
    raise ValidationError(
        f"{via} joins this machine's Ray cluster, and there is none: "
        f"RAY_ADDRESS is not set and `ray start` has not written {current}; pass --ray HOST:PORT, "
        "or --ray local for a cluster of the run's own"
    )
