"""The eval config's ``[ray]`` section and the ``--ray`` flags (docs/scale-out.md).

```toml
[ray]
address = "10.0.0.1:6379"       # a cluster's HOST:PORT, "local" (a one-node cluster of the
                                # run's own) or "auto" (this machine's cluster: RAY_ADDRESS,
                                # or the one `ray start` started here)
min_replicas = 2                # halt when fewer replicas are healthy (the head's counts)
resource = "rollbridge_host"    # the custom resource that marks the nodes meant for replicas
```

Every key is optional; ``--ray`` and ``--ray-min-replicas`` win over the section. The result
is runtime-only, like the tunnel flags: never a manifest input, so a run resumes with or
without Ray, on another cluster size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config_tables import optional_table
from launcher.errors import ValidationError

__all__ = [
    "BUILTIN_RESOURCES",
    "DEFAULT_RESOURCE",
    "HOST_PATTERN",
    "MAX_MIN_REPLICAS",
    "RAY_KEYS",
    "RESOURCE_PATTERN",
    "RayConfig",
    "RaySettings",
    "check_address",
    "check_min_replicas",
    "ray_section",
    "resolve_ray",
]

RAY_KEYS = ("address", "min_replicas", "resource")
#: The resource a cluster may give its replica nodes when ``[ray].resource`` names none.
DEFAULT_RESOURCE = "rollbridge_host"
#: A bound that only refuses typos (``min_replicas = 20000``).
MAX_MIN_REPLICAS = 10_000
HOST_PATTERN = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$"
RESOURCE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
#: Ray's own resources, asked for with num_cpus=... rather than by name.
BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
# Matched whole: with re.match, "$" also matches before a final newline ("a\n:80").
_HOST = re.compile(HOST_PATTERN)
_RESOURCE = re.compile(RESOURCE_PATTERN)
# ASCII digits only: str.isdigit() (and int()) also take other scripts' digits.
_PORT = re.compile("[0-9]+")


@dataclass(frozen=True)
class RayConfig:
    """The ``[ray]`` section as written (None: the key is absent)."""

    address: str | None = None
    min_replicas: int | None = None
    resource: str | None = None


@dataclass(frozen=True)
class RaySettings:
    """What a ``--ray`` run uses: flags over the config over the defaults."""

    address: str
    """``local``, a cluster's ``HOST:PORT``, or ``auto`` until the run resolves it
    (:func:`launcher.cluster.flags.this_machines_cluster`)."""
    min_replicas: int = 1
    """Fewer healthy replicas than this (the supervisor's own counts) halt the run."""
    resource: str = DEFAULT_RESOURCE
    """Nodes carrying this custom resource get replicas (every node when none carries it)."""


def split_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a cluster address ``HOST:PORT`` (an IPv6 host without its
    brackets); None when ``address`` is not one."""
    host, sep, port = address.strip().rpartition(":")
    if (
        not sep
        or not _HOST.fullmatch(host)
        or not _PORT.fullmatch(port)
        or not 0 < int(port) < 65536
    ):
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def check_address(address: str, what: str) -> str:
    """``address`` when it is ``local``, ``auto`` or ``HOST:PORT``; else one line saying what
    ``what`` (the flag or the key) takes."""
    value = address.strip()
    if value not in ("local", "auto") and split_address(value) is None:
        raise ValidationError(
            f"{what} must be a Ray cluster address HOST:PORT (e.g. 10.0.0.1:6379), 'local' "
            f"or 'auto', got {address!r}"
        )
    return value


def check_min_replicas(value: Any, what: str) -> int:
    """``value`` when it is an integer from 1 to :data:`MAX_MIN_REPLICAS`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{what} must be an integer >= 1, got {value!r}")
    if not 1 <= value <= MAX_MIN_REPLICAS:
        raise ValidationError(f"{what} must be from 1 to {MAX_MIN_REPLICAS}, got {value}")
    return value


def ray_section(data: dict[str, Any], path: Path) -> RayConfig | None:
    """The ``[ray]`` section of a parsed eval TOML, checked; None when it is absent."""
    section = optional_table(data, "ray", RAY_KEYS, path)
    if section is None:
        return None
    address = section.get("address")
    if address is not None:
        if not isinstance(address, str):
            raise ValidationError(f"ray.address must be a string in {path}, got {address!r}")
        address = check_address(address, f"ray.address in {path}")
    minimum = section.get("min_replicas")
    if minimum is not None:
        minimum = check_min_replicas(minimum, f"ray.min_replicas in {path}")
    resource = section.get("resource")
    if resource is not None and (
        not isinstance(resource, str)
        or not _RESOURCE.fullmatch(resource)
        or resource in BUILTIN_RESOURCES
    ):
        raise ValidationError(
            f"ray.resource in {path} must name a custom Ray resource (letters, digits, "
            f"'_', '.', '-'; not CPU, GPU or memory), got {resource!r}"
        )
    return RayConfig(address=address, min_replicas=minimum, resource=resource)


def resolve_ray(
    config: RayConfig | None, address_flag: str | None, min_replicas_flag: int | None
) -> RaySettings | None:
    """The settings of a ``--ray`` run (flags win), or None for a run without Ray."""
    section = config or RayConfig()
    if address_flag is not None:
        if not address_flag.strip():
            raise ValidationError("--ray needs a cluster address (host:port), 'local' or 'auto'")
        address: str | None = check_address(address_flag, "--ray")
    else:
        address = section.address
    if min_replicas_flag is not None:
        check_min_replicas(min_replicas_flag, "--ray-min-replicas")
    if address is None:
        if min_replicas_flag is not None:
            raise ValidationError(
                "--ray-min-replicas needs --ray ADDRESS (or address in the config's [ray])"
            )
        return None
    minimum = min_replicas_flag if min_replicas_flag is not None else section.min_replicas
    if address == "local" and minimum is not None and minimum > 1:
        # A cluster of the run's own is this one machine: one node, so one replica.
        where = "--ray-min-replicas" if min_replicas_flag is not None else "[ray] min_replicas"
        raise ValidationError(
            f"{where} {minimum} can never be met by --ray local: the run's own cluster is this "
            "machine alone, with one replica; use 1, or join a cluster of several nodes"
        )
    return RaySettings(
        address=address,
        min_replicas=minimum if minimum is not None else 1,
        resource=section.resource or DEFAULT_RESOURCE,
    )
