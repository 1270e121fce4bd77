"""Caches of digest-named directories, pruned to the most recently used without removing one
that a live process uses.

Two caches grow by one directory whenever a rollout's code changes: the sandbox bundles
(``~/.cache/rollbridge/bundles/<digest>/``, :mod:`rollout_server.harbor.bundle`, about 40 MB each
with its copy of uv) and a Ray node's rollout environments (``node-envs/<digest>/``,
:mod:`launcher.cluster.ship`, a venv each). Each entry has a use lock beside it,
``<digest>.lock``:

- A process that uses an entry holds a shared ``flock`` on its lock for as long as it uses it
  (:func:`hold`; the kernel drops it when the process dies, ``kill -9`` included) and takes it
  *before* it looks the entry up, so an entry it found cannot go while it is held. Taking it
  also sets the lock file's mtime: the entry's last use.
- :func:`prune` keeps the ``keep`` most recently used entries (and the caller's own) and removes
  the others whose lock it can take exclusively without waiting: nobody holds them. It first
  renames the entry aside (lookups see it whole or not at all), removes it, then unlinks the
  lock (and the build lock ``<digest>.build``, where the cache has one) while still holding it.
  A holder that was waiting on that lock finds the path no longer names the file it locked and
  takes the new one (:func:`hold` checks the inode), so it never holds a removed entry's lock.

Scratch directories (``.tmp-*``, ``.trash-*``) older than a day are crashed builds or removals
and go too. Blocking file work: call it on a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Hold", "Pruned", "hold", "keep_count", "prune"]

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_SCRATCH = (".tmp-", ".trash-")
#: Scratch directories younger than this may belong to a build or removal under way.
SCRATCH_AGE_S = 24 * 3600.0


class Hold:
    """A shared lock on one cache entry (see the module docstring): it is not pruned while
    held. :meth:`release` (or the process's exit) lets it go."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the last descriptor of the open file drops its flock

    def abandon(self, entry: Path) -> None:
        """Release after a build of ``entry`` failed: the lock file goes too when nobody else
        holds it and ``entry`` is not there (a failed build leaves nothing in the cache)."""
        if self._fd < 0:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # another process holds it (and may build it): the lock stays
        else:
            if _names(self.path, self._fd) and not os.path.lexists(entry):
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        self.release()

    @property
    def held(self) -> bool:
        """Whether :meth:`release` has not run yet."""
        return self._fd >= 0


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune` removed."""

    entries: int = 0
    bytes: int = 0


def _lock(path: Path, mode: int) -> int | None:
    """A descriptor of ``path`` locked with ``mode`` (``LOCK_SH``/``LOCK_EX``, maybe with
    ``LOCK_NB``: None when it would wait). Retries when the file was unlinked (by a prune)
    while this waited, so the lock is always on the file the path names."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _names(path, fd):
            return fd
        os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a prune may have unlinked it)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


def hold(root: Path, name: str) -> Hold:
    """Hold the entry ``root/name`` (present or about to be built): take its use lock shared
    (waiting while a prune removes it) and mark it used now. Raises ``OSError``."""
    path = root / f"{name}.lock"
    fd = _lock(path, fcntl.LOCK_SH)
    assert fd is not None  # a blocking lock returns a descriptor or raises
    with contextlib.suppress(OSError):
        os.utime(fd)
    return Hold(fd, path)


def keep_count(variable: str, default: int) -> int:
    """How many entries to keep: the environment variable ``variable`` when it is an integer
    of at least 1, else ``default``."""
    raw = os.environ.get(variable, "").strip()
    try:
        value = int(raw)
    except ValueError:
        return default
    return value if value >= 1 else default


def _last_use(root: Path, name: str) -> float:
    for candidate in (root / f"{name}.lock", root / name):
        with contextlib.suppress(OSError):
            return candidate.stat().st_mtime
    return 0.0


def _size(path: Path) -> int:
    total = 0
    for folder, dirs, files in os.walk(path):
        for entry in (*dirs, *files):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, entry)).st_blocks * 512
    return total


def _remove(path: Path) -> int | None:
    """Rename ``path`` aside (so no lookup sees half of it), then remove it: its bytes, or
    None when it could not be moved (gone already, or not ours)."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    try:
        os.rename(path, trash)
    except OSError:  # gone already, or not ours to move: it stays for a later prune
        return None
    return _drop(trash)


def _drop(path: Path) -> int:
    size = _size(path)
    shutil.rmtree(path, ignore_errors=True)
    return size


def prune(root: Path, keep: int, *, current: str | None = None) -> Pruned:
    """Remove the entries of ``root`` beyond the ``keep`` most recently used (``current``
    counted among them and never removed) that nobody holds, and stale scratch directories
    (see the module docstring). Best effort: what cannot be removed now stays for a later
    prune."""
    try:
        names = os.listdir(root)
    except OSError:
        return Pruned()
    now = time.time()
    entries: set[str] = set()
    removed = freed = 0
    for name in names:
        if _DIGEST.match(name):
            entries.add(name)
        elif name.endswith((".lock", ".build")) and _DIGEST.match(stem := name.split(".")[0]):
            entries.add(stem)  # locks left without their entry (a failed build)
        elif name.startswith(_SCRATCH) and now - _last_use(root, name) > SCRATCH_AGE_S:
            freed += _drop(root / name)
    ranked = sorted(entries - {current}, key=lambda n: _last_use(root, n), reverse=True)
    for name in ranked[max(keep - (current is not None), 0) :]:
        lock = root / f"{name}.lock"
        try:
            fd = _lock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue
        if fd is None:
            continue  # held: a live process uses it
        try:
            size = _remove(root / name)
            if size is not None:
                removed, freed = removed + 1, freed + size
            for leftover in (root / f"{name}.build", lock):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        finally:
            os.close(fd)
    return Pruned(removed, freed)
