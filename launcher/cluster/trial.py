"""A remote rollout's trial directory on its way into the run directory (docs/scale-out.md).

The node agent packs the directory with :func:`pack_trial` into its item's answer; the
supervisor writes it under the run directory with :func:`unpack_trial` before it journals the
result. A directory of regular files and directories only (a workflow's trial is one) travels
as a list of ``(relative path, mode, contents)`` entries (contents None: a directory; the
trial's own mode first, as ``"."``), which costs the supervisor a few system calls per file;
anything else in it (a symlink, a device) makes it a tar, unpacked with tarfile's ``data``
filter. A tar costs the supervisor a pure-Python parse on top (about 0.4 ms of CPU more for a
two-file trial, for every remote item).

A small trial (:func:`is_small`: at most 16 entries and 64 KB) is cheaper to write on the trio
thread than to hand to a worker thread and back (about 0.1 ms against 0.3 ms of CPU here);
larger ones go to one worker thread, one at a time. Entries are written straight into the
target, made with an exclusive ``mkdir`` (rollout ids are new for each attempt, so it does not
exist), each file and directory created relative to the target's descriptor: for the echo
trial 2 ``mkdir`` and 2 file creations, nothing else that changes an inode. A target that
exists already (or a tar) goes through a temporary sibling and a rename that replaces it. An
unpack that fails removes what it wrote; an entry that would land outside the target is refused
before anything is written.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

__all__ = [
    "Entries",
    "Packed",
    "UnsafeEntry",
    "is_small",
    "pack_trial",
    "packed_size",
    "trial_tar",
    "unpack_trial",
]

#: ``(relative POSIX path, mode, contents)``; contents None is a directory.
Entries = list[tuple[str, int, bytes | None]]
#: A packed trial: its entries, or a tar (empty bytes: no trial directory).
Packed = Entries | bytes


class UnsafeEntry(ValueError):
    """An entry of a packed trial that would land outside its directory."""


def trial_tar(trial: Path) -> bytes:
    """The trial directory ``trial`` as an uncompressed tar (empty bytes when it is absent)."""
    if not trial.is_dir():
        return b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(trial, arcname=".")
    return buffer.getvalue()


def _entries(trial: Path) -> Entries | None:
    """The entries of ``trial``, or None when it holds anything but files and directories."""
    entries: Entries = [(".", stat.S_IMODE(trial.stat().st_mode), None)]
    for root, dirs, files in os.walk(trial):
        base = Path(root)
        for name in [*dirs, *files]:
            path = base / name
            info = path.lstat()
            relative = path.relative_to(trial).as_posix()
            if stat.S_ISDIR(info.st_mode):
                entries.append((relative, stat.S_IMODE(info.st_mode), None))
            elif stat.S_ISREG(info.st_mode):
                entries.append((relative, stat.S_IMODE(info.st_mode), path.read_bytes()))
            else:
                return None
    return entries


def pack_trial(trial: Path) -> Packed:
    """``trial`` as entries, or as a tar when it holds a symlink or a special file (empty
    bytes when it is absent)."""
    if not trial.is_dir():
        return b""
    entries = _entries(trial)
    return trial_tar(trial) if entries is None else entries


def packed_size(packed: Packed) -> int:
    """The bytes a packed trial carries (its files' contents, or the tar's size)."""
    if isinstance(packed, bytes):
        return len(packed)
    return sum(len(data) for _, _, data in packed if data is not None)


#: A trial :func:`is_small` at most: entries, and the bytes of their contents.
SMALL_ENTRIES = 16
SMALL_BYTES = 64 * 1024


def is_small(packed: Packed) -> bool:
    """Whether ``packed`` is a few small files (no tar): written inline, not on a thread."""
    return (
        isinstance(packed, list)
        and len(packed) <= SMALL_ENTRIES
        and packed_size(packed) <= SMALL_BYTES
    )


def _relative(name: str) -> tuple[str, ...]:
    """``name``'s parts as ``PurePosixPath(name).parts`` has them (empty and ``.`` parts
    dropped), refusing an absolute name or a ``..`` part. Split by hand: a ``PurePosixPath``
    per entry was about a third of the unpack's Python time, for every remote item."""
    parts = tuple(part for part in name.split("/") if part and part != ".")
    if not name or name.startswith("/") or ".." in parts:
        raise UnsafeEntry(f"refused trial entry {name!r}")
    return parts


def _mode_of_root(entries: Entries) -> int:
    # No group/other write, no setuid/setgid/sticky bit, the owner's read and write (and a
    # directory's search) kept, as tarfile's data filter does for files; a directory keeps its
    # own mode too, so a trial written private (0700/0600, as a local run's) stays private.
    own = entries[0][1] if entries and entries[0][0] == "." else 0o700  # pack_trial's first
    return (own & 0o755) | 0o700


def _write_entries(entries: Entries, root: Path) -> None:
    """Write ``entries`` into the new directory ``root`` (FileExistsError when it exists)."""
    relative = [(_relative(name), mode, data) for name, mode, data in entries]
    os.mkdir(root, _mode_of_root(entries))
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            _write_at(relative, fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_at(entries: list[tuple[tuple[str, ...], int, bytes | None]], fd: int) -> None:
    # Paths relative to the new root's descriptor: no walk from ``/`` per file, no Path objects.
    made: set[tuple[str, ...]] = {()}  # one mkdir per directory: creating inodes is the cost
    for parts, mode, data in entries:
        if data is None:
            if parts not in made and parts != (".",):
                _make_dirs(parts, (mode & 0o755) | 0o700, made, fd)
            continue
        if parts[:-1] not in made:
            _make_dirs(parts[:-1], 0o700, made, fd)
        file_fd = os.open("/".join(parts), _CREATE, (mode & 0o755) | 0o600, dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(file_fd, view) :]
        finally:
            os.close(file_fd)


def _make_dirs(parts: tuple[str, ...], mode: int, made: set[tuple[str, ...]], fd: int) -> None:
    for depth in range(1, len(parts) + 1):
        prefix = parts[:depth]
        if prefix not in made:
            with contextlib.suppress(FileExistsError):  # listed later than its contents
                os.mkdir("/".join(prefix), mode if depth == len(parts) else 0o700, dir_fd=fd)
            made.add(prefix)


def unpack_trial(packed: Packed, target: Path) -> list[tuple[str, str]]:
    """Write a packed trial as ``target`` (see the module docstring); refuse entries that
    would land outside it (:class:`UnsafeEntry`). A tar's members that tarfile's ``data``
    filter refuses (a link to an absolute path or out of the trial, a device, a fifo) are left
    out, as a local trial's unsafe artifacts are (launcher.rundir.projections): returned as
    ``(name, reason)``, for the log. Nothing of a failed unpack stays behind."""
    if packed == b"":
        return []
    if not isinstance(packed, bytes):
        try:
            _write_entries(packed, target)
            return []
        except FileExistsError:
            if not target.is_dir():
                raise
    temp = target.with_name(f".{target.name}.unpack")
    shutil.rmtree(temp, ignore_errors=True)
    skipped: list[tuple[str, str]] = []

    def data_only(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        try:
            return tarfile.data_filter(member, path)
        except tarfile.FilterError as exc:
            skipped.append((member.name, str(exc)))
            return None

    try:
        if isinstance(packed, bytes):
            temp.mkdir(mode=0o700)  # made even when every member is left out
            with tarfile.open(fileobj=io.BytesIO(packed), mode="r") as tar:
                tar.extractall(temp, filter=data_only)
            os.chmod(temp, 0o700)  # as an unpack of entries makes it (the tar keeps the source's)
        else:
            _write_entries(packed, temp)
        shutil.rmtree(target, ignore_errors=True)
        temp.rename(target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return skipped
