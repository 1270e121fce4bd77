"""Durable file writes (docs/spec/supervisor.md §3.1): temp file + fsync + rename + directory fsync.

Every file written here gets mode 0600 (created ``O_EXCL``, as ``mkstemp`` would); directories
created here get 0700.
``durable=False`` keeps the atomic rename but skips both fsyncs: used for projection copies
that are rebuilt from the fsync'd journal anyway, so a crash can never leave a torn file but
may leave an older one.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from rollout_server.net.jsonbytes import renders_like_json

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "WriteFailure",
    "append_whole",
    "atomic_copy_bytes",
    "atomic_copy_file",
    "atomic_write_bytes",
    "atomic_write_json",
    "canonical_json",
    "canonical_json_bytes",
    "ensure_dir",
    "fast_sorted_json",
    "fsync_dir",
    "pretty_json_bytes",
    "read_to_end",
    "rewrite_in_place",
]

FILE_MODE = 0o600
DIR_MODE = 0o700

# What a user can do about a failed write, by errno; anything else is a failing device.
_ADVICE = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free space within your disk quota",
    errno.EROFS: "the file system is read-only; make it writable",
    errno.EACCES: "make the run directory writable",
    errno.EPERM: "make the run directory writable",
}


@dataclass(frozen=True)
class WriteFailure:
    """A file of the run directory that could not be written, and why (a full disk, a
    read-only or unwritable directory, an I/O error)."""

    path: Path
    error: OSError

    def cause(self) -> str:
        """One line naming the file and what to do (the resume command is a next step)."""
        reason = self.error.strerror or str(self.error)
        advice = _ADVICE.get(self.error.errno or 0, "check the disk")
        return f"could not write {self.path}: {reason}; {advice}"


_SORTED_ENCODE: Final = msgspec.json.Encoder(order="sorted").encode


def fast_sorted_json(obj: Any) -> bytes | None:
    """``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` as UTF-8,
    from msgspec (a fraction of the cost), or None when that could differ in any way (see
    :func:`~rollout_server.net.jsonbytes.renders_like_json`; a lone surrogate, which UTF-8
    cannot hold, is None too): the caller then takes the stdlib path. Byte-identical output
    is pinned by a differential test."""
    try:
        if not renders_like_json(obj):
            return None
        return _SORTED_ENCODE(obj)
    except (RecursionError, UnicodeEncodeError, TypeError, ValueError, OverflowError):
        return None


def canonical_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, compact separators, UTF-8 text kept, NaN/Infinity refused."""
    fast = fast_sorted_json(obj)
    if fast is not None:
        return fast.decode("utf-8")
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def canonical_json_bytes(obj: Any) -> bytes:
    """:func:`canonical_json` as UTF-8, a lone surrogate written back as its JSON escape
    (``backslashreplace``, as :func:`pretty_json_bytes` does)."""
    fast = fast_sorted_json(obj)
    if fast is not None:
        return fast
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8", "backslashreplace")


def pretty_json_bytes(obj: Any) -> bytes:
    """The JSON file format of §3.1: ``indent=2``, UTF-8 text kept, NaN refused, trailing newline.

    A lone surrogate (from a ``\\udXXX`` escape in some upstream JSON) cannot be UTF-8
    encoded; ``backslashreplace`` writes it back as the same JSON escape, so the file stays
    valid and reads back to the same string. The other JSON writers do the same.
    """
    return (json.dumps(obj, ensure_ascii=False, indent=2, allow_nan=False) + "\n").encode(
        "utf-8", "backslashreplace"
    )


def ensure_dir(path: Path) -> None:
    """Create ``path`` and any missing parents, each with mode 0700 (subject to the umask)."""
    path = Path(path)
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or create inside it is durable.

    Filesystems that cannot fsync a directory answer EINVAL or EACCES; that is ignored.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EACCES):
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EACCES):
            raise
    finally:
        os.close(fd)


_TEMP_FLAGS: Final = (
    os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)
_TEMP_SEQUENCE = itertools.count()


def _open_temp(path: str) -> tuple[int, str]:
    """Create ``.<name>.<unique>.tmp`` next to ``path`` (mode 0600, never an existing file or
    a link) and return its descriptor and path: ``tempfile.mkstemp``'s guarantees, with a
    name unique in this process (pid and a counter) instead of a random one, which costs a
    fraction of it; a name left by an earlier process is skipped."""
    parent, name = os.path.split(path)
    base = f"{parent or '.'}/.{name}.{os.getpid():x}"
    for _ in range(10_000):
        temp = f"{base}-{next(_TEMP_SEQUENCE):x}.tmp"
        try:
            return os.open(temp, _TEMP_FLAGS, FILE_MODE), temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no usable temporary file name", path)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes | bytearray, *, durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` atomically (mode 0600); readers see old or new, never half.

    The path is handled as a string and its directory is created only when the temporary file
    cannot be made for want of it: every finished item writes its projections through here,
    and the directory almost always exists (no pathlib objects, one ``stat`` fewer per file).
    """
    path = os.fspath(path)
    parent = os.path.dirname(path) or "."
    try:
        fd, tmp_name = _open_temp(path)
    except FileNotFoundError:
        ensure_dir(Path(parent))
        fd, tmp_name = _open_temp(path)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp_name, path)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            # os.write/os.fsync name no file; the caller's message must say which one failed.
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise
    if durable:
        fsync_dir(parent)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    """Atomically write ``obj`` as the §3.1 JSON file format (indent 2, trailing newline)."""
    atomic_write_bytes(path, pretty_json_bytes(obj), durable=durable)


def atomic_copy_file(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, durable: bool = True
) -> None:
    """Copy the bytes of regular file ``src`` to ``dst`` atomically, never as a link.

    ``src`` is opened with ``O_NOFOLLOW`` so a symlink swapped in after the caller's checks
    is refused (``OSError``). The copy keeps the source's mtime, which lets callers skip an
    identical re-copy cheaply (see :func:`launcher.rundir.projections.copy_if_changed`).
    """
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        data = read_to_end(fd, st.st_size)
    finally:
        os.close(fd)
    atomic_copy_bytes(dst, data, st, durable=durable)


def atomic_copy_bytes(
    dst: str | os.PathLike[str], data: bytes, source: os.stat_result, *, durable: bool = True
) -> None:
    """Write ``data``, the whole content just read from a file whose status was ``source``, to
    ``dst`` as :func:`atomic_copy_file` copies that file (its mtime kept): for a caller that
    has already read the file, so it is not opened and read a second time."""
    atomic_write_bytes(dst, data, durable=durable)
    os.utime(dst, ns=(source.st_atime_ns, source.st_mtime_ns))


def read_to_end(fd: int, size_hint: int) -> bytes:
    """The rest of open file ``fd``, read with ``os.read`` (``size_hint``, the size ``fstat``
    gave, makes it one read and the read that sees the end): a buffered file object costs
    four more system calls per file, which the per-item projections feel."""
    parts = []
    request = size_hint + 1
    while chunk := os.read(fd, request):
        parts.append(chunk)
        request = 1 << 20
    return b"".join(parts)


def rewrite_in_place(target: Path, data: bytes) -> None:
    """Overwrite ``target`` in place with ``data`` and fsync it, for when an atomic write could
    not be made (a full disk still lets an existing file's blocks be rewritten), so a reader
    never sees a run that ended as ``running``. Best effort: a missing file or an I/O error
    leaves it as it was; a torn file is repaired by the next open, which rebuilds every
    projection from the journal."""
    try:
        fd = os.open(target, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def append_whole(fd: int, data: bytes) -> None:
    """Write ``data`` in full at the end of the append-only file ``fd`` and fsync it. On an
    :class:`OSError` the file is cut back to where it was (best effort, so what is left stays
    whole lines) and the error re-raised."""
    size_before = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        try:
            os.ftruncate(fd, size_before)
            os.fsync(fd)
        except OSError:
            pass
        raise
