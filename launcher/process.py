"""Child processes of the supervisor: locating uv, running ``uv sync``, spawning children in
their own session, stopping them by process group, and reaping orphans after a ``kill -9``.

Every child (uv, the rollout server) starts in a new session so that it and anything it forks
share one process group we can signal as a unit, and so that a Ctrl-C on the terminal reaches
only the supervisor, which then decides how to stop its children (hazard 3: never ``uv run``).
Ownership records (``server.json``) carry the pid, the pgid and the kernel start time of the
leader, so a later invocation can prove a leftover process is really ours before killing it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import trio

from launcher.errors import DependencyError, LocalEvalError
from launcher.rundir.atomic import atomic_write_json

#: Grace between SIGTERM and SIGKILL for an ordinary stop.
STOP_GRACE_S = 5.0
#: Grace for a rollout server after an interrupt or halt, and for an orphaned server: covers the
#: server's own drain (10 + 120 + 10 s) and a backend shutdown of up to 180 s.
LONG_STOP_GRACE_S = 330.0
#: Grace for an orphaned tunnel.
TUNNEL_REAP_GRACE_S = 5.0

OutputSink = Callable[[str], None]


def find_uv(rollout: str) -> Path:
    """Locate the ``uv`` executable: next to this interpreter's scripts, then next to
    ``sys.executable``, then on ``PATH`` (``pip install rollbridge[cli]`` installs it as a
    package, so the first two places find it in a fresh virtual environment)."""
    names = ("uv.exe", "uv") if os.name == "nt" else ("uv",)
    candidates: list[Path] = []
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.extend(Path(scripts) / n for n in names)
    candidates.extend(Path(sys.executable).parent / n for n in names)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("uv")
    if found:
        return Path(found)
    raise LocalEvalError(
        f"uv is required to launch the rollout server from rollouts/{rollout}/pyproject.toml; "
        "install uv and retry"
    )


def child_environment(base: Mapping[str, str], *overlays: Mapping[str, str]) -> dict[str, str]:
    """The environment for a child: ``base`` minus ``VIRTUAL_ENV`` (the supervisor's own venv
    must not leak into the rollout's), then each overlay in order (later wins)."""
    env = {k: v for k, v in base.items() if k != "VIRTUAL_ENV"}
    for overlay in overlays:
        env.update(overlay)
    return env


def start_token(pid: int) -> str | None:
    """The kernel start time of ``pid`` (field 22 of ``/proc/<pid>/stat``), which tells a
    reused pid apart from the process we started. None when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            return str(psutil.Process(pid).create_time())
        except (psutil.Error, OSError):
            return None
    fields = stat[stat.rfind(")") + 2 :].split()
    # fields[0] is field 3 (state); field 22 is therefore fields[19].
    return fields[19] if len(fields) > 19 else None


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return members


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(_group_members(pgid))


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def terminate_group(
    pgid: int,
    grace: float,
    *,
    leader: trio.Process | None = None,
    hurry: trio.Event | None = None,
) -> bool:
    """SIGTERM process group ``pgid``, wait up to ``grace`` seconds for it to go, then SIGKILL
    whatever is left (a psutil sweep of the group). ``hurry``, when set during the wait, cuts
    the grace down to :data:`STOP_GRACE_S` (a second Ctrl-C). Returns True when the group is
    confirmed gone. Runs shielded: stopping a child must finish even while we are cancelled."""
    with trio.CancelScope(shield=True):
        _killpg(pgid, signal.SIGTERM)
        deadline = trio.current_time() + grace
        hurried = False
        while group_alive(pgid) or (leader is not None and leader.returncode is None):
            now = trio.current_time()
            if hurry is not None and hurry.is_set() and not hurried:
                hurried = True
                deadline = min(deadline, now + STOP_GRACE_S)
            if now >= deadline:
                break
            if leader is not None and leader.returncode is None:
                with trio.move_on_after(0.05):
                    await leader.wait()
            else:
                await trio.sleep(0.05)
        for proc in _group_members(pgid):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _killpg(pgid, signal.SIGKILL)
        if leader is not None:
            with trio.move_on_after(2.0):
                await leader.wait()
        for _ in range(100):
            if not group_alive(pgid):
                return True
            await trio.sleep(0.02)
        return not group_alive(pgid)


@dataclass
class Child:
    """A child process in its own session, whose merged stdout/stderr is copied line by line to
    a sink. ``last_line`` keeps the last non-empty line for error messages."""

    process: trio.Process
    name: str
    last_line: str = ""
    output_done: trio.Event | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def stop(self, grace: float = STOP_GRACE_S, hurry: trio.Event | None = None) -> bool:
        """Stop the child's process group (SIGTERM, then SIGKILL after ``grace``)."""
        return await terminate_group(self.pid, grace, leader=self.process, hurry=hurry)


async def _pump_output(child: Child, stream: trio.abc.ReceiveStream, sink: OutputSink) -> None:
    buffer = b""
    try:
        async for chunk in stream:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", errors="replace").rstrip("\r")
                if line.strip():
                    child.last_line = line.strip()
                sink(line)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        if buffer:
            line = buffer.decode("utf-8", errors="replace").rstrip("\r")
            if line.strip():
                child.last_line = line.strip()
            sink(line)
        assert child.output_done is not None
        child.output_done.set()


async def spawn_child(
    nursery: trio.Nursery,
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path,
    env: Mapping[str, str],
    sink: OutputSink,
    name: str,
) -> Child:
    """Start ``argv`` in a new session with merged output piped to ``sink`` (one call per line,
    run in ``nursery``). The child is not waited for; call :meth:`Child.stop` or wait on
    ``child.process``."""
    process = await trio.lowlevel.open_process(
        [os.fspath(a) for a in argv],
        cwd=os.fspath(cwd),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    child = Child(process=process, name=name, output_done=trio.Event())
    assert process.stdout is not None
    nursery.start_soon(_pump_output, child, process.stdout, sink)
    return child


async def uv_sync(
    uv: Path,
    rollout_dir: Path,
    rollout: str,
    *,
    env: Mapping[str, str],
    sink: OutputSink,
    logs_hint: str,
    redact: Callable[[str], str],
) -> None:
    """Run ``uv sync --project <rollout_dir>`` to completion (no timeout: the first sync may
    download a lot). Output goes to ``sink``. Cancellation stops uv's group (5 s grace).
    A non-zero exit raises :class:`DependencyError` with uv's last line."""
    async with trio.open_nursery() as nursery:
        child = await spawn_child(
            nursery,
            [uv, "sync", "--project", rollout_dir],
            cwd=rollout_dir,
            env=child_environment(env),
            sink=sink,
            name="uv",
        )
        try:
            rc = await child.process.wait()
        except BaseException:
            await child.stop(STOP_GRACE_S)
            raise
        assert child.output_done is not None
        with trio.move_on_after(0.5):
            await child.output_done.wait()
    if rc != 0:
        tail = f": {redact(child.last_line)}" if child.last_line else ""
        raise DependencyError(
            f"uv sync failed for rollouts/{rollout} with exit code {rc}{tail}\nLogs: {logs_hint}"
        )


def utc_now_iso() -> str:
    """UTC ISO-8601 with microseconds and a ``Z`` suffix."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def owner_record(pid: int, instance_id: str, port: int) -> dict[str, Any]:
    """The ownership record for a freshly spawned child (its own session: pgid == pid).
    Raises OSError when the child is already gone or cannot be identified."""
    token = start_token(pid)
    if token is None or start_token(pid) != token:
        raise OSError(errno.ESRCH, "process vanished while being identified")
    return {
        "pid": pid,
        "pgid": os.getpgid(pid),
        "start_token": token,
        "instance_id": instance_id,
        "port": port,
        "created_at": utc_now_iso(),
    }


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Write an ownership record atomically with mode 0600 (temp file, fsync, rename)."""
    atomic_write_json(path, dict(record))


@dataclass(frozen=True)
class ReapedChild:
    """A leftover child that was stopped: what, which pid, which port."""

    kind: str
    pid: int
    port: int | None

    def note(self) -> str:
        """The terminal note printed after a successful reap."""
        what = "rollout server" if self.kind == "server" else "cloudflared tunnel"
        return (
            f"terminated an orphaned {what} from a previous invocation "
            f"(pid {self.pid}, port {self.port})"
        )


def _read_record(run_dir: Path, name: str) -> dict[str, Any] | None:
    try:
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        try:
            data = json.loads(fh.read(65536))
        except (ValueError, OSError):
            return None
    return data if isinstance(data, dict) else None


def _owned(record: Mapping[str, Any]) -> tuple[int, int] | None:
    pid, pgid, token = record.get("pid"), record.get("pgid"), record.get("start_token")
    if not isinstance(pid, int) or not isinstance(pgid, int) or isinstance(pid, bool):
        return None
    if pid <= 1 or pgid <= 1 or not isinstance(token, str):
        return None
    if start_token(pid) != token:
        return None
    try:
        if os.getpgid(pid) != pgid:
            return None
    except OSError:
        return None
    return pid, pgid


async def reap_run_dir(run_dir: Path, *, hurry: trio.Event | None = None) -> list[ReapedChild]:
    """Stop the children recorded in ``run_dir``'s ``server.json``/``tunnel.json`` if they are
    provably ours (pid, start token and pgid all match), then unlink the records. The caller
    holds the run's lock (or knows nobody does). ``hurry`` cuts a long grace to 5 s."""
    reaped: list[ReapedChild] = []
    for name, kind, grace in (
        ("server.json", "server", LONG_STOP_GRACE_S),
        ("tunnel.json", "tunnel", TUNNEL_REAP_GRACE_S),
    ):
        path = run_dir / name
        if not path.is_file() or path.is_symlink():
            continue
        record = _read_record(run_dir, name)
        owned = _owned(record) if record is not None else None
        if owned is not None and record is not None:
            pid, pgid = owned
            await terminate_group(pgid, grace, hurry=hurry)
            port = record.get("port")
            reaped.append(ReapedChild(kind, pid, port if isinstance(port, int) else None))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return reaped


def _dirs_with_records(output_root: Path, skip: str | None) -> list[Path]:
    if not output_root.is_dir():
        return []
    found = []
    for entry in sorted(output_root.iterdir()):
        if entry.name == skip or entry.name.startswith(".") or entry.is_symlink():
            continue
        if entry.is_dir() and any((entry / n).is_file() for n in ("server.json", "tunnel.json")):
            found.append(entry)
    return found


def _try_lock(lock_path: Path) -> int | None:
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


async def reap_orphans(
    output_root: Path, *, skip: str | None = None, hurry: trio.Event | None = None
) -> list[ReapedChild]:
    """Reap leftovers in every run directory under ``output_root`` whose lock is free (a held
    lock means a live supervisor owns those children). ``skip`` names a run this process
    will reap itself under its own lock."""
    reaped: list[ReapedChild] = []
    for entry in _dirs_with_records(output_root, skip):
        fd = _try_lock(output_root / ".locks" / f"{entry.name}.lock")
        if fd is None:
            continue
        try:
            reaped.extend(await reap_run_dir(entry, hurry=hurry))
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    return reaped
