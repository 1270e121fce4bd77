"""Installs ``_compose_shim.py`` as the ``podman-compose`` a trial's Harbor process finds first.

The shim is written under the trials root as ``bin/<digest>/podman-compose`` (0700; the digest
covers its text, which names this interpreter and the real podman-compose, so rollout servers
sharing the root never overwrite each other's), once per backend.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

__all__ = ["install_compose_shim"]

_SHIM = Path(__file__).with_name("_compose_shim.py")


def install_compose_shim(trials_root: Path, harbor_bin: Path) -> Path | None:
    """The directory holding the shim (to put first on PATH), or None when there is no real
    podman-compose to hand the other commands to (Harbor then uses ``podman compose``)."""
    search = os.pathsep.join([str(harbor_bin), os.environ.get("PATH", "")])
    real = shutil.which("podman-compose", path=search)
    if real is None:
        return None
    text = _SHIM.read_text(encoding="utf-8").replace('REAL = ""', f"REAL = {real!r}", 1)
    script = f"#!{sys.executable} -I\n{text}".encode()
    directory = trials_root / "bin" / hashlib.sha256(script).hexdigest()[:16]
    target = directory / "podman-compose"
    if target.is_file():
        return directory
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = directory / f".podman-compose.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
    with os.fdopen(fd, "wb") as handle:
        handle.write(script)
    os.replace(temp, target)
    return directory
