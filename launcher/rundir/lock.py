"""The lock of a named run: one exclusive, non-blocking ``flock`` per name.

The lock file lives outside the run directory, at ``<output_root>/.locks/<name>.lock``, so that
a run directory can be removed or replaced while nobody holds its lock. A run that left
nothing behind removes its lock file too (:meth:`RunLock.remove`). The supervisor holds its
run's lock for the whole invocation; the orphan reaper takes the lock of every other run it
touches, and a lock that is held means a live supervisor owns that run's children.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

from launcher.errors import ConflictError, LocalEvalError
from launcher.rundir.atomic import ensure_dir

__all__ = ["RunLock", "is_held", "lock_path", "run_is_live", "try_flock"]


def lock_path(output_root: Path, name: str) -> Path:
    """``<output_root>/.locks/<name>.lock`` (outside the run directory, docs/spec/supervisor.md §3.10)."""
    return Path(output_root) / ".locks" / f"{name}.lock"


def is_held(lock: Path) -> bool:
    """Whether a supervisor holds ``lock`` now (a shared probe, released at once)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
    finally:
        os.close(fd)
    return False


def run_is_live(run_dir: Path) -> bool:
    """Whether a supervisor works on ``run_dir`` now (it holds the run's lock). A copy of a
    run directory elsewhere has no live supervisor."""
    run_dir = Path(run_dir)
    return is_held(lock_path(run_dir.parent, run_dir.name))


_REOPEN_ATTEMPTS = 8


def _same_file(fd: int, path: Path) -> bool:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def try_flock(path: Path) -> int | None:
    """Open (creating, 0600) and take an exclusive non-blocking ``flock`` on ``path``: the open
    descriptor, or None when another process holds it. The kernel releases the lock when the
    holder dies; other errors raise :class:`OSError`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return fd


class RunLock:
    """The exclusive, non-blocking ``flock`` of a named run, released on close. Deleted only by
    :meth:`remove`, under the lock, when the run left no directory behind."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def try_acquire(cls, output_root: Path, name: str) -> RunLock | None:
        """Take the lock, or return None when another holder has it.

        The lock file is created with mode 0600 if missing. Any other failure (the directory
        cannot be created, the file cannot be opened) raises :class:`OSError`.
        """
        path = lock_path(output_root, name)
        ensure_dir(path.parent)
        # A holder may delete the file (:meth:`remove`) while this one opens it: a lock on a
        # file no longer at ``path`` guards nothing, so open the new file and try again.
        for _ in range(_REOPEN_ATTEMPTS):
            fd = try_flock(path)
            if fd is None:
                return None
            if _same_file(fd, path):
                return cls(path, fd)
            os.close(fd)
        return None

    @classmethod
    def acquire(
        cls, output_root: Path, name: str, *, command: str = "rollbridge eval run"
    ) -> RunLock:
        """Take the lock or raise ConflictError naming the lock file (LocalEvalError when the
        output root cannot hold one: read-only, not a directory, no permission)."""
        try:
            lock = cls.try_acquire(output_root, name)
        except OSError as exc:
            where = exc.filename or lock_path(output_root, name)
            raise LocalEvalError(
                f"cannot lock run {name!r} under the output root {output_root}: {where}: "
                f"{exc.strerror or exc}"
            ) from None
        if lock is None:
            raise ConflictError(
                f"another `{command}` already holds {lock_path(output_root, name)}. "
                "Wait for it to finish, or use a different --name."
            )
        return lock

    def remove(self) -> None:
        """Delete the lock file, then release: for a run that left nothing behind. A process
        that opened the file before the delete sees it gone after its ``flock`` and retries."""
        if self._fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self.release()

    def release(self) -> None:
        """Unlock and close (idempotent)."""
        if self._fd >= 0:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
