"""Finding the cloudflared binary without surprises.

Order: an explicit path, then ``PATH``, then the binary pycloudflared may already have cached in
its package directory, then (only when the user opted in) a download through pycloudflared.
This tool must work offline, and a download into site-packages is a surprise, so downloading is
never the default.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tunnel.errors import CloudflaredNotFound

#: CLI flag naming an explicit cloudflared binary (the launcher defines it; named in messages).
CLOUDFLARED_PATH_FLAG = "--cloudflared"
#: CLI flag allowing a one-time download through pycloudflared.
DOWNLOAD_FLAG = "--download-cloudflared"

_INSTALL_HINT = (
    "Install it (macOS: `brew install cloudflared`; other platforms: "
    "https://developers.cloudflare.com/cloudflare-one/connections/connect-networks/downloads/)"
)


def locate_cloudflared(explicit: Path | None = None, *, allow_download: bool = False) -> Path:
    """Return the absolute path of a runnable cloudflared binary.

    ``explicit`` (the ``--cloudflared`` option) wins and must be an executable file. Otherwise
    ``PATH`` is searched, then pycloudflared's cache. With ``allow_download`` a missing binary is
    downloaded through pycloudflared: that blocks on the network, so call this through
    ``trio.to_thread.run_sync`` in that case. Raises :class:`CloudflaredNotFound` naming every
    option when nothing is found.
    """
    if explicit is not None:
        path = explicit.expanduser()
        if not _is_executable(path):
            raise CloudflaredNotFound(
                f"{CLOUDFLARED_PATH_FLAG} {explicit} is not an executable file. Point it at the "
                f"cloudflared binary, or drop the option to search PATH."
            )
        return path.resolve()
    found = shutil.which("cloudflared")
    if found is not None:
        return Path(found).resolve()
    cached = _pycloudflared_cached()
    if cached is not None:
        return cached
    if allow_download:
        return _pycloudflared_download()
    raise CloudflaredNotFound(
        "This rollout needs a public chat endpoint, but the `cloudflared` binary is not on PATH "
        f"(nor given with {CLOUDFLARED_PATH_FLAG}, nor cached by pycloudflared). {_INSTALL_HINT}, "
        f"pass {CLOUDFLARED_PATH_FLAG} PATH, allow a one-time download with {DOWNLOAD_FLAG}, "
        "or run your own tunnel and pass --advertise-url instead."
    )


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _pycloudflared_cached() -> Path | None:
    try:
        from pycloudflared.util import get_info
    except ImportError:
        return None
    try:
        executable = Path(get_info().executable)
    except RuntimeError:  # platform pycloudflared has no binary for
        return None
    return executable.resolve() if _is_executable(executable) else None


def _pycloudflared_download() -> Path:
    try:
        from pycloudflared.util import download, get_info
    except ImportError:
        raise CloudflaredNotFound(
            f"{DOWNLOAD_FLAG} needs the pycloudflared package, which is not installed. "
            f"{_INSTALL_HINT}, or run your own tunnel and pass --advertise-url instead."
        ) from None
    try:
        executable = Path(download(get_info()))
    except Exception as exc:  # any network or platform failure is reported the same way
        raise CloudflaredNotFound(
            f"could not download cloudflared through pycloudflared: {type(exc).__name__}: {exc}. "
            f"{_INSTALL_HINT}, or run your own tunnel and pass --advertise-url instead."
        ) from None
    if not _is_executable(executable):
        raise CloudflaredNotFound(
            f"pycloudflared downloaded {executable}, but it is not an executable file. "
            f"{_INSTALL_HINT}, or run your own tunnel and pass --advertise-url instead."
        )
    return executable.resolve()
