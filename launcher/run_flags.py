"""Run flags that ``eval run`` and ``ctl start`` (the daemon's client) both take, defined once so
that their names, values and help cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

__all__ = ["shard_and_ray_options"]

F = TypeVar("F", bound=Callable[..., object])

_OPTIONS = (
    click.option("--shard", default=None, help="Run only shard i/N of the rows (0 <= i < N)."),
    click.option(
        "--ray",
        default=None,
        is_flag=False,
        flag_value="auto",  # --ray alone: launcher.cluster.flags.this_machines_cluster
        metavar="[ADDRESS|local]",
        help="Run replicas on a Ray cluster: ADDRESS, 'local' (one of the run's own), or alone: "
        "this machine's cluster (RAY_ADDRESS, or the one `ray start` started).",
    ),
    click.option(
        "--ray-min-replicas", type=int, default=None, help="Halt when fewer replicas are healthy."
    ),
)


def shard_and_ray_options(command: F) -> F:
    """``--shard``, ``--ray`` and ``--ray-min-replicas`` on ``command``, in that order."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
