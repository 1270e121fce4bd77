"""The lock of a named run: one exclusive, non-blocking ``flock`` per name.

The lock file lives outside the run directory, at ``<output_root>/.locks/<name>.lock``, so that
a run directory can be removed or replaced while nobody holds its lock. The supervisor holds its
run's lock for the whole invocation; the orphan reaper takes the lock of every other run it
touches, and a lock that is held means a live supervisor owns that run's children.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

from launcher.errors import ConflictError
from launcher.rundir.atomic import ensure_dir

__all__ = ["RunLock", "lock_path"]


def lock_path(output_root: Path, name: str) -> Path:
    """``<output_root>/.locks/<name>.lock`` (outside the run directory, docs/spec/supervisor.md §3.10)."""
    return Path(output_root) / ".locks" / f"{name}.lock"


class RunLock:
    """The exclusive, non-blocking ``flock`` of a named run. Never deleted; released on close."""

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
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return None
            raise
        return cls(path, fd)

    @classmethod
    def acquire(
        cls, output_root: Path, name: str, *, command: str = "rollbridge eval run"
    ) -> RunLock:
        """Take the lock or raise ConflictError naming the lock file."""
        lock = cls.try_acquire(output_root, name)
        if lock is None:
            raise ConflictError(
                f"another `{command}` already holds {lock_path(output_root, name)}. "
                "Wait for it to finish, or use a different --name."
            )
        return lock

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
