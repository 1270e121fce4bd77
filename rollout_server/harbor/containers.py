"""Finding and removing a trial's containers by label, and reaping those of dead owners.

Every trial's compose overlay labels its containers with :data:`TRIAL_LABEL` (the trial name) and
:data:`OWNER_LABEL` (the rollout server's pid and kernel start time, so a reused pid is not
mistaken for the owner). A sweep removes one trial's containers (with their anonymous volumes),
compose networks and built images, and on request its compose volumes; the start-up reap
(:mod:`.reaper`) does the same for every trial whose owner is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import trio

__all__ = [
    "OWNER_LABEL",
    "TRIAL_LABEL",
    "compose_project",
    "orphan_trials",
    "owner_alive",
    "owner_token",
    "project_prefix",
    "remove_trials",
    "sweep_trial",
]

TRIAL_LABEL = "io.rollbridge.harbor.trial"
OWNER_LABEL = "io.rollbridge.harbor.owner"
_ENGINE_TIMEOUT_S = 60.0


def compose_project(trial_name: str) -> str:
    """The compose project Harbor gives a trial: ``<trial>__env``, lower-cased, sanitised."""
    name = f"{trial_name}__env".lower()
    if not name[:1].isalnum():
        name = "0" + name
    return "".join(c if c.isalnum() or c in "_-" else "-" for c in name)


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on; the command name may contain spaces."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return fields if len(fields) > 19 else None


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    # Field 22 (starttime).
    return fields[19].decode() if fields is not None else None


def owner_token(pid: int | None = None) -> str:
    """``<pid>:<start time>`` of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid) or '?'}"


def owner_alive(token: str) -> bool:
    """Whether the process a :func:`owner_token` names still runs."""
    pid_text, _, start = token.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    fields = _stat_fields(pid)
    if fields is not None and fields[0] in (b"Z", b"X"):
        # A zombie is dead: its parent died too and nobody has reaped it yet (a PID 1 that does
        # not reap, as in some VMs and containers). Its containers are orphans.
        return False
    current = fields[19].decode() if fields is not None else None
    if current is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return start == "?"
    return start in ("?", current)


@dataclass(frozen=True)
class _Container:
    id: str
    name: str
    labels: dict[str, str]


def _parse_ps(stdout: bytes) -> list[_Container]:
    try:
        rows = json.loads(stdout or b"[]")
    except ValueError:
        return []
    found = []
    for row in rows if isinstance(rows, list) else []:
        names = row.get("Names") or []
        name = names[0] if isinstance(names, list) and names else str(names)
        labels = row.get("Labels") or {}
        found.append(_Container(str(row.get("Id", "")), name, dict(labels)))
    return found


def _ps_argv(engine: str, label: str) -> list[str]:
    return [engine, "ps", "-a", "--filter", f"label={label}", "--format", "json"]


def _rm_argv(engine: str, ids: Sequence[str]) -> list[str]:
    return [engine, "rm", "-f", "-v", "-t", "0", *ids]


def project_prefix(trial_name: str) -> str:
    """The prefix of every compose project of a trial: its environment's (``<trial>__env``)
    and its separate verifiers' (``<trial>__verifier__<key>``)."""
    return compose_project(trial_name)[: -len("env")]


def _list_argvs(engine: str) -> tuple[list[str], list[str]]:
    # Go templates work on podman and docker alike (their JSON output differs).
    return (
        [engine, "network", "ls", "--format", "{{.Name}}"],
        [engine, "images", "--format", "{{.Repository}}:{{.Tag}}"],
    )


def _volumes_argv(engine: str) -> list[str]:
    return [engine, "volume", "ls", "--format", "{{.Name}}"]


def _external_argv(engine: str) -> list[str]:
    """Every container podman's storage holds, with those its database does not know: a
    ``podman run`` killed while it created one leaves it there, without labels (docker has no
    ``--external`` and lists nothing here)."""
    return [engine, "ps", "-a", "--external", "--format", "{{.ID}} {{.Names}}"]


def _leftover_argvs(
    engine: str,
    trial_names: Sequence[str],
    networks: bytes,
    images: bytes,
    volumes: bytes = b"",
    external: bytes = b"",
) -> list[list[str]]:
    """Commands removing what compose made for the trials besides labelled containers: the
    containers named for them that a killed ``podman run`` left unlabelled in storage, their
    networks, the images they built and their named volumes (``down --rmi local --volumes``
    never ran when Harbor was killed, or was left to the backend), found by their compose
    project's name, whatever phase the trial died in."""
    prefixes = tuple(project_prefix(name) for name in trial_names)
    if not prefixes:
        return []
    unlabelled = [
        cid
        for cid, _, name in (
            line.partition(" ") for line in external.decode(errors="replace").splitlines()
        )
        if cid and name.strip().startswith(prefixes)
    ]
    vols = [v for v in volumes.decode(errors="replace").split() if v.startswith(prefixes)]
    nets = [n for n in networks.decode(errors="replace").split() if n.startswith(prefixes)]
    # By name, never by id: an image that also carries another tag (a base image) only loses
    # the trial's tag.
    tags = [
        t
        for t in images.decode(errors="replace").split()
        if t.removeprefix("localhost/").startswith(prefixes)
    ]
    argvs = [[engine, "rm", "-f", *unlabelled]] if unlabelled else []
    if nets:
        argvs.append([engine, "network", "rm", "-f", *nets])
    if tags:
        argvs.append([engine, "rmi", "-f", *tags])
    if vols:
        argvs.append([engine, "volume", "rm", "-f", *vols])
    return argvs


async def _run(argv: list[str]) -> bytes:
    with trio.move_on_after(_ENGINE_TIMEOUT_S):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
        return bytes(done.stdout)
    return b""


async def remove(engine: str, ids: Sequence[str]) -> None:
    """``<engine> rm -f -t 0 <ids>`` (bounded; a container already gone is no error)."""
    await _run(_rm_argv(engine, ids))


async def sweep_trial(engine: str, trial_name: str, *, volumes: bool = False) -> list[str]:
    """Remove every container labelled with ``trial_name``, and its compose networks and images
    (and, with ``volumes``, its compose project's named volumes, as ``down --volumes`` does).

    Returns the names of the containers removed. Best effort: a missing engine removes nothing.
    """
    try:
        found = _parse_ps(await _run(_ps_argv(engine, f"{TRIAL_LABEL}={trial_name}")))
        if found:
            await _run(_rm_argv(engine, [c.id for c in found]))
        argvs = [
            *_list_argvs(engine),
            _volumes_argv(engine) if volumes else [],
            _external_argv(engine),
        ]
        listed = [b""] * len(argvs)

        async def list_one(index: int, argv: list[str]) -> None:
            # Inside a nursery an OSError would arrive wrapped in a group: nothing listed.
            with contextlib.suppress(OSError):
                listed[index] = await _run(argv)

        async with trio.open_nursery() as nursery:
            for index, argv in enumerate(argvs):
                if argv:
                    nursery.start_soon(list_one, index, argv)
        for argv in _leftover_argvs(engine, [trial_name], *listed):
            await _run(argv)
    except OSError:
        return []
    return [c.name for c in found]


def _run_blocking(argv: list[str]) -> bytes:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_ENGINE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return b""
    return done.stdout


def orphan_trials(engine: str, owner: str | None = None) -> dict[str, list[str]]:
    """Trial name -> ids of its labelled containers whose owner process is gone (or, with
    ``owner``, whose owner is ``owner``). Blocking."""
    orphans: dict[str, list[str]] = {}
    for container in _parse_ps(_run_blocking(_ps_argv(engine, OWNER_LABEL))):
        token = container.labels.get(OWNER_LABEL, "")
        if token == owner if owner is not None else not owner_alive(token):
            trial = container.labels.get(TRIAL_LABEL, "?")
            orphans.setdefault(trial, []).append(container.id)
    return orphans


def remove_trials(engine: str, containers: Sequence[str], trial_names: Sequence[str]) -> None:
    """Remove ``containers``, then the networks and images of ``trial_names``. Blocking."""
    if containers:
        _run_blocking(_rm_argv(engine, containers))
    list_networks, list_images = _list_argvs(engine)
    networks, images = _run_blocking(list_networks), _run_blocking(list_images)
    volumes = _run_blocking(_volumes_argv(engine))
    external = _run_blocking(_external_argv(engine))
    for argv in _leftover_argvs(engine, trial_names, networks, images, volumes, external):
        _run_blocking(argv)
