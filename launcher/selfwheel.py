"""A wheel of the running rollbridge, for rollout environments that cannot get it from an index.

A rollout's ``pyproject.toml`` depends on ``rollbridge`` by name, as on any published package.
Where the package index cannot serve it (this tool is not on one yet; an air-gapped cluster; a
pre-release), ``uv sync`` gets the directory holding this wheel as a ``--find-links`` source and
resolves it offline. The wheel is made once per installed content and cached under
``~/.cache/rollbridge/self-wheel/<digest>/``:

* installed as files (from a wheel, an index, or a directory without ``-e``: files listed in
  ``RECORD``): *repacked* from the installed files, byte for byte
  (:func:`rollout_server.harbor.wheelhouse.repack`), so it is exactly the code that runs here,
  whether or not the wheel or checkout pip installed from still exists or has changed since;
  keyed by ``RECORD`` and each installed file's size and modification time, so a file changed
  in place makes a new wheel too;
* installed editable from a directory (a checkout, ``pip install -e .``, PEP 610
  ``dir_info.editable``): *built* from it with ``uv build --wheel``, keyed by the digest of its
  source files, so an edit makes a new wheel.

The cache is ``$XDG_CACHE_HOME/rollbridge/self-wheel``; when it cannot be written (a read-only
home), a directory of the user's own under the system's temporary directory is used instead.
``ROLLBRIDGE_WHEELHOUSE`` names a directory of shipped wheels to use instead (nothing is built).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlsplit

from rollout_server.harbor.wheelhouse import (
    BundleError,
    InstalledDist,
    file_sha256,
    repack,
    source_files,
    uv_build_wheel,
)

__all__ = [
    "KEEP",
    "SHIPPED_ENV",
    "SelfWheelError",
    "default_cache_root",
    "installed_differs",
    "self_wheel",
    "source_dir",
]

#: A directory of shipped wheels (one of them rollbridge's) that replaces the build.
SHIPPED_ENV = "ROLLBRIDGE_WHEELHOUSE"


class SelfWheelError(RuntimeError):
    """No wheel of the running rollbridge can be made; the message says why, in one line."""


def default_cache_root() -> Path:
    """``~/.cache/rollbridge/self-wheel`` (``XDG_CACHE_HOME`` honoured)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollbridge" / "self-wheel"


def source_dir(dist: metadata.Distribution) -> Path | None:
    """The directory rollbridge was installed from in editable mode (PEP 610 ``dir_info`` with
    ``editable``), if it still exists: the code that runs here is that directory's. Installed
    from a directory without ``-e``, the code that runs is the installed copy (None)."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return None
    info = direct.get("dir_info") if isinstance(direct, dict) else None
    if not isinstance(info, dict) or info.get("editable") is not True:
        return None
    url = direct.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme != "file":
        return None
    path = Path(unquote(parts.path))
    return path if path.is_dir() else None


def _digest(dist: metadata.Distribution, source: Path | None) -> str:
    digest = hashlib.sha256(f"rollbridge {dist.version}\n".encode())
    if source is None:
        record = dist.locate_file(f"{_dist_info_name(dist)}/RECORD")
        digest.update(Path(str(record)).read_bytes())
        # RECORD says what was installed; a file changed in place since (a patch applied to
        # site-packages) shows in its size or time only.
        for file in dist.files or ():
            if file.suffix == ".pyc" or file.parts[:1] == ("..",):
                continue  # byte code and scripts are not repacked
            try:
                st = os.stat(str(dist.locate_file(file)))
            except OSError:
                continue
            digest.update(f"{file} {st.st_size} {st.st_mtime_ns}\n".encode())
    else:
        for name in source_files(source, use_git=True):
            digest.update(f"{name} {file_sha256(source / name)}\n".encode())
    return digest.hexdigest()[:24]


def _dist_info_name(dist: metadata.Distribution) -> str:
    path = getattr(dist, "_path", None)
    if not isinstance(path, Path):
        raise SelfWheelError("rollbridge's installed metadata is not a directory on disk")
    return path.name


def _make(dist: metadata.Distribution, source: Path | None, out: Path, uv: Path) -> Path:
    if source is not None:
        return uv_build_wheel(str(uv), source, out, python=Path(sys.executable), what="rollbridge")
    info = Path(str(dist.locate_file(_dist_info_name(dist))))
    installed = InstalledDist(
        name="rollbridge",
        version=dist.version,
        dist_info=info,
        source_dir=None,
        record_sha256="",
        requires=tuple(dist.requires or ()),
    )
    return repack(installed, info.parent, Path(sys.prefix), out)


#: Wheels kept in the cache (a checkout makes one per edited state); the oldest go first. A
#: workspace whose uv.lock names a removed one re-resolves against the current one.
KEEP = 5


def _prune(root: Path, keep: Path) -> None:
    made = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    made.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in made if p != keep][KEEP - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def self_wheel(uv: Path, *, cache_root: Path | None = None) -> Path:
    """The directory to hand uv as ``--find-links``: it holds a wheel of the running rollbridge.

    Made on first use and cached (see the module docstring). Raises :class:`SelfWheelError`."""
    shipped = os.environ.get(SHIPPED_ENV)
    if shipped:
        # Absolute: uv runs in the rollout's directory, not in this one.
        folder = Path(shipped).expanduser().absolute()
        if not any(folder.glob("rollbridge-*.whl")):
            raise SelfWheelError(f"{SHIPPED_ENV}={shipped} holds no rollbridge-*.whl")
        return folder
    try:
        dist = metadata.distribution("rollbridge")
    except metadata.PackageNotFoundError:
        raise SelfWheelError("rollbridge is not installed as a distribution") from None
    source = source_dir(dist)
    try:
        key = _digest(dist, source)
    except OSError as exc:
        raise SelfWheelError(f"cannot make a wheel of the running rollbridge: {exc}") from None
    roots = [default_cache_root, _private_temp_root] if cache_root is None else [lambda: cache_root]
    for root in roots:
        try:
            return _cached(dist, source, root(), key, uv)
        except OSError as exc:
            failure: Exception = exc  # an unwritable cache: the next place, if any
        except BundleError as exc:
            failure = exc
            break  # the wheel itself cannot be made: another place would not help
    raise SelfWheelError(f"cannot make a wheel of the running rollbridge: {failure}") from None


def _private_temp_root() -> Path:
    """The fallback cache: a directory of this user's alone under the temporary directory (a
    shared one could be planted with another user's wheel)."""
    root = Path(tempfile.gettempdir()) / f"rollbridge-self-wheel-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    st = root.lstat()
    if not root.is_dir() or root.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{root} is not a private directory of this user")
    return root


def _cached(
    dist: metadata.Distribution, source: Path | None, root: Path, key: str, uv: Path
) -> Path:
    folder = root / key
    if any(folder.glob("rollbridge-*.whl")):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".making-", dir=root))
    try:
        _make(dist, source, scratch, uv)
        try:
            scratch.rename(folder)
        except OSError:  # another run made it first: theirs is the same wheel
            if not any(folder.glob("rollbridge-*.whl")):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _prune(root, keep=folder)
    return folder


def _record(rows: str) -> dict[str, str]:
    """``RECORD`` rows as path -> hash, for files outside ``*.dist-info`` that have one."""
    found: dict[str, str] = {}
    for row in csv.reader(io.StringIO(rows)):
        if len(row) >= 2 and row[1] and ".dist-info/" not in row[0]:
            found[row[0]] = row[1]
    return found


def installed_differs(find_links: Path, venv: Path) -> bool:
    """True when ``venv`` has a rollbridge installed from an index or find-links whose files
    differ from the wheel in ``find_links`` (same version, other contents: a checkout edited
    since). uv keeps an installed version that satisfies the lock, so the caller asks it to
    reinstall. A rollbridge installed from a path or URL (``direct_url.json``) is the
    rollout's own choice and never differs, nor does another version (one its resolution took
    from an index: reinstalling it would only get the same one again, at every run)."""
    wheels = sorted(find_links.glob("rollbridge-*.whl"))
    infos = sorted(venv.glob("lib/python*/site-packages/rollbridge-*.dist-info"))
    infos += sorted(venv.glob("Lib/site-packages/rollbridge-*.dist-info"))
    if not wheels or not infos or (infos[0] / "direct_url.json").exists():
        return False
    if wheels[-1].name.split("-")[1] != infos[0].name.removesuffix(".dist-info").split("-")[1]:
        return False
    try:
        with zipfile.ZipFile(wheels[-1]) as archive:
            record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
            wanted = _record(archive.read(record).decode("utf-8"))
        have = _record((infos[0] / "RECORD").read_text(encoding="utf-8"))
    except (OSError, StopIteration, zipfile.BadZipFile, UnicodeDecodeError):
        return True
    return any(have.get(path) != digest for path, digest in wanted.items())
