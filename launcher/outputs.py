"""Where ``-o`` writes: the file of ``eval report``, ``eval diff``, ``eval export`` and
``eval rubric``.

The four commands share these rules, so they cannot drift apart:

- ``-o`` names a file. An existing directory is refused, and so is a path ending in ``/`` that
  is no directory (it would otherwise silently become a file of that name). ``eval rubric``
  documents ``-o DIR/`` as "a report inside DIR" and maps it to a file before calling here.
- A file among runs' own files (inside a run directory, or anywhere under a workspace's
  ``.osmosis``: the runs, their locks, the daemon's token and records) is refused, symlinks resolved, except the names a command writes there
  itself (such as ``<run dir>/report.html``): overwriting a journal or a manifest loses results.
- A regular file (or a new path) is replaced atomically, through a temporary file with a
  unique name that is removed on any failure, its missing parent directories created. An
  existing file that is not a regular file (a FIFO, ``/dev/null``, ``/dev/stdout``) is written
  straight into and never replaced.
- A failed write is one line naming the ``-o`` path, never the temporary file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from launcher.errors import LocalEvalError
from launcher.reporting.resolve import find_workspace_root
from launcher.rundir.atomic import atomic_write_bytes
from launcher.rundir.manifest import is_run_dir

__all__ = ["check_writable", "output_path", "refuse_run_files", "write_output"]

_SEPARATORS = tuple(sep for sep in (os.sep, os.altsep) if sep)
_EVALS = (".osmosis", "evals")


def output_path(value: str, cwd: Path) -> Path:
    """The file ``-o value`` names, relative to ``cwd`` (``~`` expanded, symlinks kept).

    Raises :class:`LocalEvalError` for an existing directory and for a value ending in ``/``.
    """
    path = cwd / Path(value).expanduser()
    if path.is_dir():
        raise LocalEvalError(f"-o {path} is a directory; -o takes the file to write")
    if value.endswith(_SEPARATORS):
        raise LocalEvalError(f"-o {value} ends with '/': give the file to write")
    return path


def refuse_run_files(
    target: Path,
    *,
    cwd: Path,
    runs: Iterable[Path] = (),
    allowed: Iterable[Path] = (),
    what: str = "output",
    default: Path | None = None,
) -> None:
    """Refuse ``target`` when it is among runs' own files: inside a run directory (one with a
    manifest or a journal), or under ``.osmosis`` of the workspace around ``cwd`` or of any of
    ``runs`` (runs, locks, the daemon's files). Symlinks are resolved first; the files in ``allowed`` (a command's own
    file inside its run directory) pass. ``what`` and ``default`` only word the message."""
    real = target.resolve()
    if real in {path.resolve() for path in allowed}:
        return
    roots = set()
    for run in runs:
        parent = run.resolve().parent
        if parent.parts[-2:] == _EVALS:
            roots.add(parent.parent)  # the workspace's .osmosis: runs, the daemon's files
    workspace = find_workspace_root(cwd)
    if workspace is not None:
        roots.add((workspace / _EVALS[0]).resolve())
    if any(parent in roots or is_run_dir(parent) for parent in real.parents):
        shown = f"{target} (that is {real})" if real != target else str(target)
        hint = f" (the default is {default})" if default is not None else ""
        raise LocalEvalError(
            f"-o {shown} is among the files of runs; write the {what} outside run "
            f"directories and .osmosis{hint}"
        )


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _special(path: Path) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a directory (symlinks
    followed): a FIFO, a character device, a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_writable(path: Path) -> None:
    """Make sure ``path`` can be written before any costly work: its missing parent
    directories are created and a temporary file is made and removed next to it. An existing
    FIFO or device is written in place, so it is only checked to exist (opening a FIFO would
    wait for a reader)."""
    if _special(path):
        return
    real = path.resolve()
    if real.is_dir():
        raise LocalEvalError(f"-o {path} is a directory; -o takes the file to write")
    for ancestor in real.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise LocalEvalError(f"cannot write {path}: {ancestor} is not a directory")
            break
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".probe", dir=real.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LocalEvalError(f"cannot write {path}: {_reason(exc)}") from None


def _open_special(path: Path) -> int | None:
    """A descriptor open for writing on ``path`` when it is an existing FIFO or device, else
    None (a regular file, a directory or nothing: the atomic replace handles those)."""
    if not _special(path):
        return None
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY)
    if stat.S_ISREG(os.fstat(fd).st_mode):  # replaced by a regular file since the stat
        os.close(fd)
        return None
    return fd


def write_output(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (see the module docstring) and return where it went: the
    resolved file for a regular one, ``path`` itself for a FIFO or device.

    Raises :class:`LocalEvalError` naming ``path`` when the write fails.
    """
    try:
        fd = _open_special(path)
        if fd is None:
            real = path.resolve()
            # Replacing through the resolved path keeps a symlink and updates what it names.
            atomic_write_bytes(real, data, durable=False)
            return real
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        return path
    except OSError as exc:
        raise LocalEvalError(f"cannot write {path}: {_reason(exc)}") from None
