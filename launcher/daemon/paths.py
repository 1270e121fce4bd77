"""The files a request names, checked before the daemon hands them to a CLI child.

- Every path is confined to the daemon's workspace (symlinks resolved), as a start's
  ``config`` is.
- Nothing under the workspace's ``.osmosis/`` is read or written for a request, spelled there
  or reached through a symlink: the runs, their locks and the daemon's own files (its token in
  ``daemon.json``, its lock, its run records) live there. A read would hand them to a judge
  provider or a report; a write would lose results or the daemon itself.
- An output names a file (a trailing ``/`` is kept, never silently dropped): the rubric's
  ``DIR/`` is a report inside ``DIR``, as ``-o DIR/`` is; elsewhere it is refused as ``-o``
  refuses it. An existing file is replaced only when the request says ``"overwrite": true``
  (409 otherwise), as a save dialog asks before replacing.
"""

from __future__ import annotations

import os
from pathlib import Path

from launcher.daemon.apierror import ApiError, refuse_nul

__all__ = ["inside_workspace", "output_path", "read_path", "refuse_osmosis"]

_OSMOSIS = ".osmosis"
_SEPARATORS = tuple(sep for sep in (os.sep, os.altsep) if sep)


def inside_workspace(workspace: Path, key: str, value: str) -> str:
    """``value`` (relative to ``workspace``, or absolute) as an absolute path inside
    ``workspace``, symlinks resolved; a 400 otherwise. Paths a request names are confined to
    the daemon's workspace, as a start's ``config`` is."""
    refuse_nul(key, value)
    root = workspace.resolve()
    path = (root / Path(value).expanduser()).resolve()
    if not path.is_relative_to(root):
        raise ApiError(400, "VALIDATION", f"{key} {value} is outside the workspace {root}")
    return str(path)


def _under_osmosis(workspace: Path, value: str, resolved: Path) -> bool:
    """Whether ``value`` is under the workspace's ``.osmosis/``: as spelled (``..`` folded) or
    once symlinks are resolved (``.osmosis`` itself may be a link)."""
    spelled = Path(os.path.normpath(workspace / Path(value).expanduser()))
    mains = {workspace / _OSMOSIS, workspace.resolve() / _OSMOSIS}
    reals = {path.resolve() for path in mains}
    return any(spelled.is_relative_to(m) for m in mains) or any(
        resolved.is_relative_to(r) for r in reals
    )


def _refused(key: str, value: str) -> ApiError:
    return ApiError(
        400,
        "VALIDATION",
        f"{key} {value} is under the workspace's .osmosis/ (the runs' and the daemon's own "
        "files); the daemon reads and writes no file there for a request",
    )


def refuse_osmosis(workspace: Path, key: str, value: str) -> None:
    """A 400 when ``value`` names a file under the workspace's ``.osmosis/`` (for a path that
    may lie outside the workspace, such as a start's ``secrets_file``)."""
    refuse_nul(key, value)
    resolved = (workspace / Path(value).expanduser()).resolve()
    if _under_osmosis(workspace, value, resolved):
        raise _refused(key, value)


def read_path(workspace: Path, key: str, value: str) -> str:
    """A file the daemon's child reads for a request (a rubric's ``@path``): inside the
    workspace and not under its ``.osmosis/``; its absolute path, symlinks resolved."""
    path = inside_workspace(workspace, key, value)
    if _under_osmosis(workspace, value, Path(path)):
        raise _refused(key, value)
    return path


def output_path(
    workspace: Path, key: str, value: str, *, overwrite: bool, directory_file: str | None = None
) -> str:
    """A file the daemon's child writes for a request, as the argument to hand it: absolute,
    symlinks resolved, with a trailing ``/`` kept when ``directory_file`` is given (the
    command then writes that file inside the directory).

    Refused: a path outside the workspace or under its ``.osmosis/`` (400), a directory or a
    path ending in ``/`` without ``directory_file`` (400), and an existing file unless
    ``overwrite`` (409)."""
    path = Path(inside_workspace(workspace, key, value))
    slash = value.endswith(_SEPARATORS)
    if directory_file is not None and (slash or path.is_dir()):
        target, argument = path / directory_file, str(path) + os.sep
    elif slash:
        raise ApiError(400, "VALIDATION", f"{key} {value} ends with '/': give the file to write")
    elif path.is_dir():
        raise ApiError(400, "VALIDATION", f"{key} {value} is a directory: give the file to write")
    else:
        target, argument = path, str(path)
    if _under_osmosis(workspace, value, target):
        raise _refused(key, value)
    if os.path.lexists(target) and not overwrite:
        shown = value if target == path else f"{value} ({target})"
        raise ApiError(
            409, "CONFLICT", f'{key} {shown} exists; send "overwrite": true to replace it'
        )
    return argument
