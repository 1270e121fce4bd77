"""The ``tunnel.json`` ownership record, process-group termination and orphan reaping.

The record lets the next invocation kill a cloudflared left behind by a supervisor that died
(``kill -9``). Ownership is proven by the pid, its process group and the kernel's start time of
the process (the "start token"), so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import trio

from tunnel.errors import TunnelRecordError

#: File name of the record inside the run directory.
TUNNEL_RECORD = "tunnel.json"
#: ``instance_id`` written into the record.
TUNNEL_INSTANCE_ID = "cloudflared"
#: SIGTERM → SIGKILL grace for a tunnel.
STOP_GRACE = 5.0

_POLL = 0.05


@dataclass(frozen=True)
class ProcessRecord:
    """The JSON shape of ``server.json`` / ``tunnel.json``."""

    pid: int
    pgid: int
    start_token: str
    instance_id: str
    port: int
    created_at: str


@dataclass(frozen=True)
class ReapedTunnel:
    """A cloudflared from a previous invocation that :func:`reap_orphan_tunnel` terminated."""

    pid: int
    port: int

    @property
    def message(self) -> str:
        """The note shown to the user."""
        return (
            "terminated an orphaned cloudflared tunnel from a previous invocation "
            f"(pid {self.pid}, port {self.port})"
        )


def read_start_token(pid: int) -> str | None:
    """The kernel's start time of ``pid`` as a string, or None if it cannot be read.

    Linux: field 22 of ``/proc/<pid>/stat`` (counted after the command name, which may contain
    spaces and parentheses). Elsewhere: ``ps -o lstart=``.
    """
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                raw = handle.read().decode("ascii", "replace")
        except OSError:
            return None
        fields = raw[raw.rfind(")") + 2 :].split()
        # fields[0] is field 3 (state), so field 22 is at index 19.
        return fields[19] if len(fields) > 19 else None
    try:
        out = subprocess.run(
            ["ps", "-p", str(pid), "-o", "lstart="],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    token = out.stdout.strip()
    return token or None


def make_tunnel_record(pid: int, port: int) -> ProcessRecord:
    """Build the ownership record of a freshly spawned cloudflared (its own session leader).

    Raises :class:`TunnelRecordError` when the process cannot be identified.
    """
    token = read_start_token(pid)
    try:
        pgid = os.getpgid(pid)
    except OSError:
        token = None
    if token is None:
        raise TunnelRecordError("could not identify the cloudflared process for orphan cleanup")
    return ProcessRecord(
        pid=pid,
        pgid=pgid,
        start_token=token,
        instance_id=TUNNEL_INSTANCE_ID,
        port=port,
        created_at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    )


def write_record_atomic(path: Path, record: ProcessRecord) -> None:
    """Write ``record`` as JSON atomically (temp file in the same directory, fsync, rename).

    The file ends up with mode 0600. Blocking: call it through ``trio.to_thread.run_sync``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(record), handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def write_tunnel_record(run_dir: Path, record: ProcessRecord) -> None:
    """Write ``<run_dir>/tunnel.json``; raises :class:`TunnelRecordError` on failure (blocking)."""
    try:
        write_record_atomic(run_dir / TUNNEL_RECORD, record)
    except OSError as exc:
        raise TunnelRecordError(f"could not record cloudflared for orphan cleanup: {exc}") from None


def remove_tunnel_record(run_dir: Path) -> None:
    """Delete ``<run_dir>/tunnel.json`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        (run_dir / TUNNEL_RECORD).unlink()


def _fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory (EINVAL/EACCES); the rename stands
    finally:
        os.close(dfd)


def _read_record_safely(run_dir: Path) -> ProcessRecord | None:
    try:
        dfd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fd = os.open(TUNNEL_RECORD, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            raw: Any = json.loads(handle.read(65536).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(dfd)
    if not isinstance(raw, dict):
        return None
    try:
        record = ProcessRecord(**{key: raw[key] for key in ProcessRecord.__dataclass_fields__})
    except (KeyError, TypeError):
        return None
    ints_ok = all(
        isinstance(value, int) and not isinstance(value, bool) and value > 0
        for value in (record.pid, record.pgid)
    )
    if not ints_ok or not isinstance(record.start_token, str) or not isinstance(record.port, int):
        return None
    return record


def owns_process(record: ProcessRecord) -> bool:
    """True when ``record`` still describes a live process (same start token and group)."""
    if read_start_token(record.pid) != record.start_token:
        return False
    try:
        return os.getpgid(record.pid) == record.pgid
    except OSError:
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members: list[psutil.Process] = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


def signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to a process group, ignoring a group that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


async def _group_gone_within(pgid: int, seconds: float) -> bool:
    # Processes that are not our children give no event on exit, so poll the process table.
    with trio.move_on_after(seconds):
        while True:
            if not group_members(pgid):
                return True
            await trio.sleep(_POLL)
    return False


async def terminate_group(pgid: int, grace: float) -> bool:
    """SIGTERM a process group, SIGKILL whatever is left after ``grace``; True if all are gone.

    SIGCONT follows SIGTERM so that a stopped process can act on it.
    """
    signal_group(pgid, signal.SIGTERM)
    signal_group(pgid, signal.SIGCONT)
    if await _group_gone_within(pgid, grace):
        return True
    signal_group(pgid, signal.SIGKILL)
    return await _group_gone_within(pgid, 2.0)


async def reap_orphan_tunnel(run_dir: Path, *, grace: float = STOP_GRACE) -> ReapedTunnel | None:
    """Terminate the cloudflared recorded in ``<run_dir>/tunnel.json`` if it is still ours.

    Call it under the run's lock. Ownership (start token and process group) is checked before any
    signal; the record is removed in every case. Returns what was terminated (for the user note),
    or None when there was no record or its process was gone or not ours.
    """
    record = _read_record_safely(run_dir)
    reaped: ReapedTunnel | None = None
    if record is not None and owns_process(record):
        await terminate_group(record.pgid, grace)
        reaped = ReapedTunnel(pid=record.pid, port=record.port)
    path = run_dir / TUNNEL_RECORD
    if path.is_symlink() or path.exists():
        with contextlib.suppress(OSError):
            path.unlink()
    return reaped
