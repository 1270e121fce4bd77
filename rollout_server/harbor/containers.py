"""Finding and removing a trial's containers by label, and reaping those of dead owners.

Every trial's compose overlay labels its containers with :data:`TRIAL_LABEL` (the trial name) and
:data:`OWNER_LABEL` (the rollout server's pid and kernel start time, so a reused pid is not
mistaken for the owner). A sweep removes one trial's containers and its compose network; the
start-up reap removes every labelled container whose owner process is gone.
"""

from __future__ import annotations

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
    "owner_alive",
    "owner_token",
    "reap_orphans",
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


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # Field 22 (starttime); the command name in parentheses may contain spaces.
    return stat.rsplit(b")", 1)[1].split()[19].decode()


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
    current = _start_time(pid)
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
    return [engine, "rm", "-f", "-t", "0", *ids]


def _leftover_argvs(engine: str, trial_name: str) -> list[list[str]]:
    """Commands removing what compose made for a trial besides containers: its network and
    the image it built (``down --rmi local`` never ran when Harbor was killed)."""
    project = compose_project(trial_name)
    return [
        [engine, "network", "rm", "-f", f"{project}_default"],
        [engine, "rmi", "-f", f"localhost/{project}_main"],
    ]


async def _run(argv: list[str]) -> bytes:
    with trio.move_on_after(_ENGINE_TIMEOUT_S):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
        return bytes(done.stdout)
    return b""


async def sweep_trial(engine: str, trial_name: str) -> list[str]:
    """Remove every container labelled with ``trial_name`` and the trial's compose network.

    Returns the names of the containers removed. Best effort: a missing engine removes nothing.
    """
    try:
        found = _parse_ps(await _run(_ps_argv(engine, f"{TRIAL_LABEL}={trial_name}")))
        if found:
            await _run(_rm_argv(engine, [c.id for c in found]))
        for argv in _leftover_argvs(engine, trial_name):
            await _run(argv)
    except OSError:
        return []
    return [c.name for c in found]


def reap_orphans(engine: str) -> list[str]:
    """Remove the labelled containers whose owner process is gone; log one line if any.

    Blocking (run at start-up, before the server serves). Returns the removed containers' names.
    """
    try:
        listed = subprocess.run(
            _ps_argv(engine, OWNER_LABEL),
            capture_output=True,
            timeout=_ENGINE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    orphans = [
        c for c in _parse_ps(listed.stdout) if not owner_alive(c.labels.get(OWNER_LABEL, ""))
    ]
    if not orphans:
        return []
    trials = sorted({c.labels.get(TRIAL_LABEL, "?") for c in orphans})
    try:
        subprocess.run(
            _rm_argv(engine, [c.id for c in orphans]),
            capture_output=True,
            timeout=_ENGINE_TIMEOUT_S,
            check=False,
        )
        for trial in trials:
            for argv in _leftover_argvs(engine, trial):
                subprocess.run(argv, capture_output=True, timeout=_ENGINE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass
    names = [c.name for c in orphans]
    message = (
        f"harbor: reaped {len(names)} orphaned container(s) of dead rollout servers "
        f"(trials {', '.join(trials)})"
    )
    # A milestone line on stdout: reaping runs before the server configures logging.
    print(message, flush=True)
    return names
