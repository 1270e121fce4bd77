"""Reading run-directory files for an upload: stable opens, hashing, the re-redaction of
``logs.txt`` (docs/upload.md; spec Part C, C.2 and C.4).

Every file that decides what is uploaded is opened as a *stable regular file*: ``lstat`` must
show a regular file, the opened descriptor must have the same (device, inode, size, mtime,
ctime) signature, and the signature must still hold after reading. A file that changes under
the upload is an error that says to retry, never a silently different upload.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bridge import KNOWN_SECRET_ENV_NAMES, REDACTED
from launcher.errors import CLIError

__all__ = [
    "HASH_CHUNK",
    "PlanFile",
    "UploadError",
    "hash_file",
    "open_stable",
    "read_stable",
    "scrub_logs_file",
]

#: Files are hashed (and streamed) in 1 MiB pieces: memory stays bounded for any file size.
HASH_CHUNK = 1 << 20

#: Values shorter than this in the environment are left alone (they would mangle the text).
_SCRUB_MIN_LENGTH = 8

Signature = tuple[int, int, int, int, int]


class UploadError(CLIError):
    """The run directory cannot be uploaded as it is (the reference's LocalEvalUploadError)."""

    default_code = "VALIDATION"


def _signature(status: os.stat_result) -> Signature:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


@contextlib.contextmanager
def open_stable(path: Path, where: str) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """Open ``path`` for reading if it is a regular file that stays the same file meanwhile."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        raise UploadError(f"{where} is missing") from None
    if not stat.S_ISREG(before.st_mode):
        raise UploadError(f"{where} must be a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise UploadError(f"{where} changed while being opened; retry") from exc
    handle = os.fdopen(fd, "rb")
    with handle:
        opened = os.fstat(handle.fileno())
        if _signature(opened) != _signature(before):
            raise UploadError(f"{where} changed while being opened; retry")
        yield handle, opened
        if _signature(os.fstat(handle.fileno())) != _signature(opened):
            raise UploadError(f"{where} changed while being read; retry")


def read_stable(path: Path, where: str) -> bytes:
    """The whole content of a stable regular file (small control files only)."""
    with open_stable(path, where) as (handle, _):
        return handle.read()


@dataclass(frozen=True)
class PlanFile:
    """One file of the upload: its upload path, where it is, and what was hashed."""

    path: str
    source: Path
    size: int
    sha256: str
    signature: Signature = field(repr=False)

    def request(self) -> dict[str, object]:
        """The ``{path, size, sha256}`` entry of the start request."""
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @contextlib.contextmanager
    def open_verified(self) -> Iterator[BinaryIO]:
        """Reopen the file, which must still be the exact file the plan hashed."""
        with open_stable(self.source, self.path) as (handle, opened):
            if _signature(opened) != self.signature:
                raise UploadError(f"{self.path} changed after the upload plan was built; retry")
            yield handle


def hash_file(path: Path, upload_path: str) -> PlanFile:
    """Hash a stable regular file in :data:`HASH_CHUNK` pieces."""
    digest = hashlib.sha256()
    with open_stable(path, upload_path) as (handle, opened):
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return PlanFile(upload_path, path, opened.st_size, digest.hexdigest(), _signature(opened))


def scrub_logs_file(path: Path, environ: Mapping[str, str], extra: tuple[str, ...] = ()) -> bool:
    """Replace the current environment's known secret values in ``logs.txt`` (C.2).

    Values of :data:`bridge.KNOWN_SECRET_ENV_NAMES` at least 8 characters long (and ``extra``,
    the platform token in use), longest first, by plain substring replacement. The file is
    rewritten (0600) only when the text changed; a missing file or a symlink is left alone.
    Returns whether it was rewritten.
    """
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
    except FileNotFoundError:
        return False
    candidates = [environ.get(name, "") for name in KNOWN_SECRET_ENV_NAMES]
    values = sorted(
        {v for v in (*candidates, *extra) if len(v) >= _SCRUB_MIN_LENGTH}, key=len, reverse=True
    )
    if not values:
        return False
    # Line by line, in two passes (find, then rewrite): a run's log can be gigabytes, and the
    # whole text held as str took twice its size in memory. A value that spans lines (none of
    # the known ones does) is looked for in the whole text.
    if any("\n" in value for value in values):
        return _scrub_whole(path, values)

    def scrubbed(line: bytes) -> bytes:
        text = line.decode("utf-8", "surrogateescape")
        for value in values:
            text = text.replace(value, REDACTED)
        return text.encode("utf-8", "surrogateescape")

    with open_stable(path, "logs.txt") as (handle, _):
        if all(scrubbed(line) == line for line in handle):
            return False

    def write(out: BinaryIO) -> None:
        with open_stable(path, "logs.txt") as (handle, _):
            for line in handle:
                out.write(scrubbed(line))

    _replace_file(path, write)
    return True


def _scrub_whole(path: Path, values: list[str]) -> bool:
    original = read_stable(path, "logs.txt").decode("utf-8", "surrogateescape")
    text = original
    for value in values:
        text = text.replace(value, REDACTED)
    if text == original:
        return False
    _replace_file(path, lambda out: out.write(text.encode("utf-8", "surrogateescape")))
    return True


def _replace_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` (0600) with what ``write`` writes, durably and atomically."""
    temporary = path.with_name(f".{path.name}.scrub-{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
