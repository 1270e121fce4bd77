"""Where a workspace's daemon lives and how others find it: the single-instance lock, the unix
socket path, and the discovery file ``.osmosis/daemon.json``.

The lock is an ``flock`` on ``.osmosis/daemon.lock`` held for the daemon's whole life, so the
kernel releases it when the daemon dies in any way (no stale pid file to second-guess). The
discovery file is written 0600 after the listeners are bound; a client trusts it only when its
``pid`` is alive with the recorded ``start_token`` (the same ownership proof as ``server.json``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.process import start_token
from launcher.rundir.atomic import DIR_MODE, atomic_write_json, ensure_dir
from launcher.rundir.lock import try_flock

__all__ = [
    "DaemonInfo",
    "DaemonLock",
    "discovery_path",
    "live_daemon",
    "read_discovery",
    "socket_path",
    "state_dir",
    "write_discovery",
]

#: ``sun_path`` holds 108 bytes on Linux and 104 on macOS; stay clearly under both.
MAX_SOCKET_PATH = 100


def osmosis_dir(workspace: Path) -> Path:
    """``<workspace>/.osmosis``."""
    return workspace / ".osmosis"


def discovery_path(workspace: Path) -> Path:
    """``<workspace>/.osmosis/daemon.json``."""
    return osmosis_dir(workspace) / "daemon.json"


def state_dir(workspace: Path) -> Path:
    """``<workspace>/.osmosis/daemon/``: the daemon's run records and child output (0700)."""
    return osmosis_dir(workspace) / "daemon"


def _private_dir(path: Path) -> Path:
    """Create ``path`` 0700 if missing; refuse one that is a symlink or not ours."""
    ensure_dir(path)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise OSError(errno.EPERM, f"{path} belongs to another user")
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def socket_path(workspace: Path) -> Path:
    """The control socket: ``.osmosis/daemon/daemon.sock`` when that path is short enough,
    else ``$XDG_RUNTIME_DIR/rollbridge/<hash>.sock`` or ``/tmp/rollbridge-<uid>/<hash>.sock``.
    The directory is created 0700."""
    local = state_dir(workspace) / "daemon.sock"
    if len(os.fsencode(local)) <= MAX_SOCKET_PATH:
        _private_dir(local.parent)
        return local
    digest = hashlib.sha256(os.fsencode(workspace.resolve())).hexdigest()[:16]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "rollbridge" if runtime else Path(f"/tmp/rollbridge-{os.getuid()}")
    return _private_dir(base) / f"{digest}.sock"


class DaemonLock:
    """The workspace's single-instance lock (``.osmosis/daemon.lock``), held until released."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def try_acquire(cls, workspace: Path) -> DaemonLock | None:
        """Take the lock, or None when another daemon holds it."""
        path = osmosis_dir(workspace) / "daemon.lock"
        ensure_dir(path.parent)
        fd = try_flock(path)
        return cls(fd) if fd is not None else None

    def release(self) -> None:
        """Unlock (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class DaemonInfo:
    """What ``daemon.json`` says about a running daemon."""

    pid: int
    start_token: str
    socket: str
    version: str
    workspace: str
    url: str | None = None
    token: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The discovery document (``url``/``token`` only with ``--http``)."""
        doc: dict[str, Any] = {
            "version": self.version,
            "pid": self.pid,
            "start_token": self.start_token,
            "socket": self.socket,
            "workspace": self.workspace,
        }
        if self.url is not None:
            doc["url"] = self.url
            doc["token"] = self.token
        return doc


def write_discovery(workspace: Path, info: DaemonInfo) -> None:
    """Write ``daemon.json`` atomically with mode 0600."""
    atomic_write_json(discovery_path(workspace), info.to_json())


def read_discovery(workspace: Path) -> DaemonInfo | None:
    """``daemon.json`` as a :class:`DaemonInfo`, or None when missing or malformed."""
    try:
        doc = json.loads(discovery_path(workspace).read_text(encoding="utf-8"))
        return DaemonInfo(
            pid=int(doc["pid"]),
            start_token=str(doc["start_token"]),
            socket=str(doc["socket"]),
            version=str(doc.get("version", "")),
            workspace=str(doc.get("workspace", "")),
            url=doc.get("url"),
            token=doc.get("token"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def live_daemon(workspace: Path) -> DaemonInfo | None:
    """The discovery record when its process is alive and is the one that wrote it."""
    info = read_discovery(workspace)
    if info is None or start_token(info.pid) != info.start_token:
        return None
    return info


def remove_discovery(workspace: Path, info: DaemonInfo) -> None:
    """Remove ``daemon.json`` if it is still ours (a successor may have replaced it)."""
    current = read_discovery(workspace)
    if current is not None and current.pid == info.pid:
        discovery_path(workspace).unlink(missing_ok=True)
