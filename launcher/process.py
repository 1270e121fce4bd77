"""Child processes of the supervisor and everything about owning them: spawning children in
their own session, stopping them by process group, the ownership records of the run directory,
and reaping orphans after a ``kill -9`` (``uv`` itself is :mod:`launcher.rollout_env`'s).

Every child (uv, the rollout server, cloudflared) starts in a new session so that it and anything
it forks share one process group we can signal as a unit, and so that a Ctrl-C on the terminal
reaches only the supervisor, which then decides how to stop its children (docs/hazards.md #3: never
``uv run``). Ownership records (``server.json``, ``tunnel.json``) carry the pid, the pgid and the
kernel start time of the leader, so a later invocation can prove a leftover process is really
ours before killing it. The tunnel package knows none of this: it is handed a
:class:`TunnelOwner` (its ``ChildOwner``) and calls it to record and stop each cloudflared.

Why one module of this size: spawning, stopping and reaping are one contract (a child is
spawned into its own group, recorded with its start token, stopped by that group, and reaped
by proving that record), and each half of a split would need the other's private rules.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from launcher.rundir.atomic import atomic_write_json
from launcher.rundir.lock import RunLock
from launcher.rundir.logs import utc_now_iso

if TYPE_CHECKING:
    import psutil

#: Grace between SIGTERM and SIGKILL for an ordinary stop.
STOP_GRACE_S = 5.0
#: Grace for a rollout server after an interrupt or halt, and for an orphaned server: covers the
#: server's own drain (10 + 120 + 10 s) and a backend shutdown of up to 180 s.
LONG_STOP_GRACE_S = 330.0
#: Grace for an orphaned tunnel.
TUNNEL_REAP_GRACE_S = 5.0

#: Output lines a :class:`Child` keeps: enough for a traceback's last frames and its error.
TAIL_LINES = 40
#: Bytes of one line of a child's output handed to the sink at most: a longer line gives its
#: first and last this many, as two lines, with a line between them saying how many bytes were
#: not logged. Each is a line, so the log's redaction of a secret's piece at a line's edge
#: covers the cuts, and a line without end (a child writing MBs with no newline) costs no more
#: memory than three of these.
LINE_PIECE = 256 * 1024
#: Characters of a line kept in :attr:`Child.last_line` and :attr:`Child.tail` (for errors).
_KEPT_CHARS = 4096
#: The rollout server's ownership record in the run directory.
SERVER_RECORD = "server.json"
#: The tunnel's ownership record in the run directory.
TUNNEL_RECORD = "tunnel.json"
#: ``instance_id`` of every ``tunnel.json``.
TUNNEL_INSTANCE_ID = "cloudflared"

#: Each record a run directory can hold: file, kind (for :class:`ReapedChild`), reaping grace.
_RECORDS = (
    (SERVER_RECORD, "server", LONG_STOP_GRACE_S),
    (TUNNEL_RECORD, "tunnel", TUNNEL_REAP_GRACE_S),
)

#: How often a stop looks at the process table: members that are not our children give no
#: event on exit.
_POLL_S = 0.05

OutputSink = Callable[[str], None]


def child_environment(base: Mapping[str, str], *overlays: Mapping[str, str]) -> dict[str, str]:
    """The environment for a child: ``base`` minus ``VIRTUAL_ENV`` (the supervisor's own venv
    must not leak into the rollout's), then each overlay in order (later wins)."""
    env = {k: v for k, v in base.items() if k != "VIRTUAL_ENV"}
    for overlay in overlays:
        env.update(overlay)
    return env


# -- process identity and groups ------------------------------------------------------------


def start_token(pid: int) -> str | None:
    """The kernel start time of ``pid``, which tells a reused pid apart from the process we
    started. None when it cannot be read.

    Linux: field 22 of ``/proc/<pid>/stat``, counted after the command name (which may contain
    spaces, parentheses and bytes that are not UTF-8). Elsewhere: psutil's create time.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        import psutil

        try:
            return str(psutil.Process(pid).create_time())
        except (psutil.Error, OSError):
            return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    # fields[0] is field 3 (state); field 22 is therefore fields[19].
    return fields[19].decode("ascii", "replace") if len(fields) > 19 else None


def group_members(pgid: int) -> list[psutil.Process]:
    """The live (non-zombie) processes whose process group is ``pgid``.

    psutil is imported here, not with the module: only a stop that finds the group still there,
    and reaping, walk the process table, and an eval run starts ~15 ms sooner without it."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (psutil.Error, OSError):
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
    return bool(group_members(pgid))


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
    """Stop process group ``pgid``: SIGTERM (then SIGCONT, so that a stopped member can act on
    it), wait up to ``grace`` seconds for the group and ``leader`` to go, then SIGKILL whatever
    is left (a psutil sweep of the group, then the group). ``hurry``, when set during the wait,
    cuts the grace down to :data:`STOP_GRACE_S` (a second Ctrl-C). Returns True when the group
    is confirmed gone. Runs shielded: stopping a child must finish even while we are cancelled.
    """
    with trio.CancelScope(shield=True):
        gone = await _escalate(pgid, grace, leader, hurry)
    return gone


async def _escalate(
    pgid: int, grace: float, leader: trio.Process | None, hurry: trio.Event | None
) -> bool:
    _killpg(pgid, signal.SIGTERM)
    _killpg(pgid, signal.SIGCONT)
    deadline = trio.current_time() + grace
    hurried = False
    # The leader first: while it runs, the group is there without walking the process table.
    while (leader is not None and leader.returncode is None) or group_alive(pgid):
        now = trio.current_time()
        if hurry is not None and hurry.is_set() and not hurried:
            hurried = True
            deadline = min(deadline, now + STOP_GRACE_S)
        if now >= deadline:
            break
        if leader is not None and leader.returncode is None:
            with trio.move_on_after(_POLL_S):
                await leader.wait()
        else:
            await trio.sleep(_POLL_S)
    else:  # No break: the group went within the grace.
        return True
    import psutil

    for proc in group_members(pgid):
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


# -- children -------------------------------------------------------------------------------


@dataclass
class Child:
    """A child process in its own session, whose merged stdout/stderr is copied line by line to
    a sink. ``last_line`` keeps the last non-empty line for error messages, ``tail`` the last
    :data:`TAIL_LINES` lines (a Python traceback, to tell a code error from a port clash).
    Both are the child's output as it was: a message that shows them redacts each as a line,
    its edges a line's edges (:meth:`launcher.redact.Redactor.redact_fragments` and then the
    whole values), as ``logs.txt`` redacts the line itself."""

    process: trio.Process
    name: str
    last_line: str = ""
    output_done: trio.Event | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def stop(self, grace: float = STOP_GRACE_S, hurry: trio.Event | None = None) -> bool:
        """Stop the child's process group (SIGTERM, then SIGKILL after ``grace``)."""
        return await terminate_group(self.pid, grace, leader=self.process, hurry=hurry)


class _Lines:
    """A child's output bytes as lines for ``sink``, long lines in pieces (:data:`LINE_PIECE`).

    Each chunk is searched for line ends once (a line that arrives in many chunks is not
    split again at each: that was quadratic in the line's length)."""

    def __init__(self, child: Child, sink: OutputSink) -> None:
        self.child = child
        self.sink = sink
        self.pending = bytearray()
        self.headed = False  # the current line's first piece was handed on
        self.skipped = 0  # bytes of the current line not handed on

    def feed(self, chunk: bytes | bytearray) -> None:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self.pending += chunk[start:end]
            self.end_line()
            start = end + 1
        self.pending += chunk[start:]
        if len(self.pending) > 2 * LINE_PIECE:
            if not self.headed:
                self._emit(bytes(self.pending[:LINE_PIECE]))
                del self.pending[:LINE_PIECE]
                self.headed = True
            excess = len(self.pending) - LINE_PIECE
            self.skipped += excess
            del self.pending[:excess]

    def end_line(self) -> None:
        if self.headed and len(self.pending) > LINE_PIECE:
            self.skipped += len(self.pending) - LINE_PIECE
            del self.pending[: len(self.pending) - LINE_PIECE]
        if self.skipped:
            self._emit(f"[… {self.skipped:,} bytes of this line not logged …]".encode())
        self._emit(bytes(self.pending))
        self.pending.clear()
        self.headed, self.skipped = False, 0

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        if line.strip():
            kept = line[:_KEPT_CHARS]
            self.child.last_line = kept.strip()
            self.child.tail.append(kept)
        self.sink(line)


async def _pump_output(child: Child, stream: trio.abc.ReceiveStream, sink: OutputSink) -> None:
    lines = _Lines(child, sink)
    try:
        async for chunk in stream:
            lines.feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        if lines.pending or lines.skipped:
            lines.end_line()
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


# -- ownership records ----------------------------------------------------------------------


def owner_record(
    pid: int, instance_id: str, port: int, *, timespec: str = "microseconds"
) -> dict[str, Any]:
    """The ownership record for a freshly spawned child (its own session: pgid == pid).

    ``timespec`` is the precision of ``created_at`` (see :func:`utc_now_iso`). Raises
    :class:`ProcessLookupError` when the child is already gone or cannot be identified: its
    start token is read before and after its process group, and the two reads must agree.
    """
    token = start_token(pid)
    pgid = os.getpgid(pid)
    if token is None or start_token(pid) != token:
        raise OSError(errno.ESRCH, "process vanished while being identified")
    return {
        "pid": pid,
        "pgid": pgid,
        "start_token": token,
        "instance_id": instance_id,
        "port": port,
        "created_at": utc_now_iso(timespec=timespec),
    }


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Write an ownership record atomically with mode 0600 (temp file, fsync, rename, directory
    fsync). Blocking."""
    atomic_write_json(path, dict(record))


class TunnelOwner:
    """The launcher's ``tunnel.ChildOwner``: owns each cloudflared the managed tunnel starts.

    :meth:`record` writes ``<run_dir>/tunnel.json`` right after the spawn, so that a later
    invocation can reap the process if this one is killed; :meth:`stop` stops its process group;
    :meth:`release` drops the record once the tunnel has seen the group gone (a record whose
    process may still run is kept for the next invocation to reap).
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / TUNNEL_RECORD
        self._recorded: int | None = None

    def record(self, pid: int, port: int) -> None:
        """Write the record of ``pid`` (blocking). :class:`ProcessLookupError` when the process
        cannot be identified, another :class:`OSError` when the record cannot be written."""
        # tunnel.json has always carried isoformat()'s default precision.
        write_record(self.path, owner_record(pid, TUNNEL_INSTANCE_ID, port, timespec="auto"))
        self._recorded = pid

    async def stop(self, process: trio.Process, grace: float) -> bool:
        """Stop ``process``'s group (SIGTERM, SIGKILL after ``grace``); True when confirmed gone."""
        return await terminate_group(process.pid, grace, leader=process)

    def release(self, pid: int) -> None:
        """Remove the record if it is ``pid``'s (blocking); a later process's record stays."""
        if self._recorded == pid:
            self.path.unlink(missing_ok=True)
            self._recorded = None


# -- reaping --------------------------------------------------------------------------------


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
    # Relative to a directory fd and with O_NOFOLLOW: a symlink swapped in for the record or for
    # the run directory is never followed.
    try:
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        try:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
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
    import psutil

    try:
        zombie = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return None
    if zombie and not group_alive(pgid):
        # Dead already, only not reaped by its (re)parent, and nothing of its group runs.
        return None
    try:
        if os.getpgid(pid) != pgid:
            return None
    except OSError:
        return None
    return pid, pgid


async def reap_run_dir(run_dir: Path, *, hurry: trio.Event | None = None) -> list[ReapedChild]:
    """Stop the children recorded in ``run_dir``'s ``server.json``/``tunnel.json`` if they are
    provably ours (pid, start token and pgid all match), then unlink the records (a symlink in a
    record's place is unlinked without being followed). The caller holds the run's lock (or
    knows nobody does). ``hurry`` cuts a long grace to 5 s."""
    reaped: list[ReapedChild] = []
    for name, kind, grace in _RECORDS:
        path = run_dir / name
        if not path.is_symlink():
            if not path.is_file():
                continue
            record = _read_record(run_dir, name)
            owned = _owned(record) if record is not None else None
            if owned is not None and record is not None:
                pid, pgid = owned
                await terminate_group(pgid, grace, hurry=hurry)
                port = record.get("port")
                reaped.append(ReapedChild(kind, pid, port if isinstance(port, int) else None))
        path.unlink(missing_ok=True)
    return reaped


def _dirs_with_records(output_root: Path, skip: str | None) -> list[Path]:
    if not output_root.is_dir():
        return []
    found = []
    for entry in sorted(output_root.iterdir()):
        if entry.name == skip or entry.name.startswith(".") or entry.is_symlink():
            continue
        if entry.is_dir() and any((entry / name).is_file() for name, _, _ in _RECORDS):
            found.append(entry)
    return found


async def reap_orphans(
    output_root: Path, *, skip: str | None = None, hurry: trio.Event | None = None
) -> list[ReapedChild]:
    """Reap leftovers in every run directory under ``output_root`` whose lock is free (a held
    lock means a live supervisor owns those children). ``skip`` names a run this process
    will reap itself under its own lock."""
    reaped: list[ReapedChild] = []
    for entry in _dirs_with_records(output_root, skip):
        try:
            lock = RunLock.try_acquire(output_root, entry.name)
        except OSError:
            continue
        if lock is None:
            continue
        with lock:
            reaped.extend(await reap_run_dir(entry, hurry=hurry))
    return reaped
