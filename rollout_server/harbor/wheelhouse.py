"""The pieces of a bundle's wheelhouse, made on the host from what is already on the machine.

Three kinds of wheel go into a wheelhouse:

- distributions installed in the rollout venv from an index: *repacked* from their installed
  files (the files their ``RECORD`` lists, byte for byte, the ``WHEEL`` file's tags), so the
  sandbox gets exactly the versions the rollout runs with locally and nothing is downloaded;
- path and editable dependencies (the SDK from a clone, for one): *built* from their source
  directory with ``uv build --wheel``;
- the rollout project itself: built the same way from a staged copy (see ``bundle.py``).

Nothing here imports the venv's packages: the venv is read as files, with
``importlib.metadata.PathDistribution`` over its ``*.dist-info`` directories.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PathDistribution
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = [
    "BundleError",
    "InstalledDist",
    "file_sha256",
    "find_uv",
    "installed_dists",
    "normalize_name",
    "repack",
    "source_files",
    "uv_build_wheel",
    "wheel_is_pure",
]


class BundleError(RuntimeError):
    """A bundle or sandbox image cannot be made; the message is one line saying what to do."""


#: Directories never part of a source tree (besides any dir holding a ``pyvenv.cfg``).
_SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".venv", "__pycache__", "build", "dist", ".osmosis",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox",
        "node_modules", ".idea", ".bench",
    }
)  # fmt: skip
_SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
_SKIP_FILES = frozenset({"uv.lock", ".DS_Store"})
#: dist-info files an installer writes (or that describe the local install), not the wheel's.
_INSTALLER_FILES = frozenset(
    {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json", "uv_cache.json", "uv_build.json"}
)
#: A fixed zip timestamp, so a repacked wheel's bytes depend on its contents only.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def normalize_name(name: str) -> str:
    """A distribution name as wheel file names spell it (``Typing-Extensions`` → ``typing_extensions``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _walk(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        keep = []
        for d in dirnames:
            full = Path(dirpath, d)
            if d in _SKIP_DIRS or d.endswith(_SKIP_SUFFIXES) or full.is_symlink():
                continue
            if (full / "pyvenv.cfg").exists():
                continue
            keep.append(d)
        dirnames[:] = sorted(keep)
        for name in sorted(filenames):
            if name in _SKIP_FILES or name.endswith(_SKIP_SUFFIXES):
                continue
            full = Path(dirpath, name)
            if full.is_file():
                yield full.relative_to(root).as_posix()


def _git_files(root: Path) -> list[str] | None:
    """The files git would see under ``root`` (tracked + untracked-not-ignored), or None."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    names = {n for n in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if n}
    return sorted(n for n in names if (root / n).is_file())


def source_files(root: Path, *, use_git: bool = False) -> list[str]:
    """Relative POSIX paths of a source tree's files, sorted; build outputs, caches, VCS data
    and virtual environments left out. ``use_git`` lists a git checkout through ``git ls-files``
    (so run dirs and other ignored files do not count), falling back to a walk."""
    if use_git:
        listed = _git_files(root)
        if listed is not None:
            return [
                n
                for n in listed
                if not any(p in _SKIP_DIRS for p in n.split("/")[:-1])
                and not n.endswith(_SKIP_SUFFIXES)
            ]
    return list(_walk(root))


@dataclass(frozen=True)
class InstalledDist:
    """One distribution installed in the rollout venv."""

    name: str
    version: str
    dist_info: Path
    #: The local source directory of a path/editable install (built from source), else None.
    source_dir: Path | None
    record_sha256: str
    requires: tuple[str, ...]

    @property
    def key(self) -> str:
        """The normalized name."""
        return normalize_name(self.name)


def _source_dir(dist: PathDistribution) -> Path | None:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict) or "dir_info" not in document:
        return None
    url = urlparse(str(document.get("url", "")))
    if url.scheme != "file":
        return None
    path = Path(unquote(url.path))
    subdirectory = document.get("subdirectory")
    return path / subdirectory if isinstance(subdirectory, str) else path


def installed_dists(site_dirs: Sequence[Path]) -> list[InstalledDist]:
    """Every ``*.dist-info`` distribution under ``site_dirs``, sorted by name."""
    found: dict[str, InstalledDist] = {}
    for site in dict.fromkeys(site_dirs):
        try:
            entries = sorted(site.iterdir())
        except OSError as exc:
            raise BundleError(
                f"cannot read the rollout venv's site-packages {site}: {exc}"
            ) from exc
        for entry in entries:
            if entry.name.endswith(".egg-info"):
                raise BundleError(
                    f"{entry.name} in {site} is a legacy install with no RECORD and cannot be "
                    "bundled; reinstall the rollout environment with uv sync"
                )
            if not entry.name.endswith(".dist-info") or not entry.is_dir():
                continue
            dist = PathDistribution(entry)
            name = dist.metadata["Name"]
            record = entry / "RECORD"
            if not name or not record.is_file():
                raise BundleError(
                    f"{entry} has no METADATA name or RECORD; reinstall the rollout "
                    "environment with uv sync"
                )
            installed = InstalledDist(
                name=name,
                version=dist.version,
                dist_info=entry,
                source_dir=_source_dir(dist),
                record_sha256=file_sha256(record),
                requires=tuple(dist.requires or ()),
            )
            found.setdefault(installed.key, installed)
    return [found[k] for k in sorted(found)]


def _wheel_tags(wheel_text: str) -> str:
    tags = [
        line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")
    ]
    if not tags:
        return "py3-none-any"
    parts = [t.split("-") for t in tags if t.count("-") == 2]
    if not parts:
        return "py3-none-any"
    return "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))


def wheel_is_pure(filename: str) -> bool:
    """True for a wheel that runs on any Python 3 and platform (``py3-none-any`` and kin)."""
    stem = filename[: -len(".whl")] if filename.endswith(".whl") else filename
    pieces = stem.split("-")
    if len(pieces) < 5:
        return False
    py, abi, plat = pieces[-3:]
    return plat == "any" and abi == "none" and all(t.startswith("py") for t in py.split("."))


def _entry_point_scripts(dist_info: Path) -> set[str]:
    path = dist_info / "entry_points.txt"
    if not path.is_file():
        return set()
    names: set[str] = set()
    section = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line and section in ("console_scripts", "gui_scripts"):
            names.add(line.split("=", 1)[0].strip())
    return names


def _restore_shebang(data: bytes) -> bytes:
    """An installed script's shebang back to the wheel's ``#!python`` placeholder."""
    if not data.startswith(b"#!"):
        return data
    first, sep, rest = data.partition(b"\n")
    if b"python" not in first:
        return data
    return b"#!python" + sep + rest


def _arcname(
    dist: InstalledDist, site: Path, prefix: Path, rel: str, scripts: set[str]
) -> str | None:
    """Where an installed file goes in the wheel (None: installer-made, leave out)."""
    full = Path(os.path.normpath(site / rel))
    data_dir = f"{dist.dist_info.name[: -len('.dist-info')]}.data"
    try:
        inside = full.relative_to(site).as_posix()
    except ValueError:
        inside = None
    if inside is not None:
        parts = inside.split("/")
        if "__pycache__" in parts[:-1] and parts[-1].endswith(".pyc"):
            return None
        if parts[0] == dist.dist_info.name and len(parts) == 2 and parts[1] in _INSTALLER_FILES:
            return None
        return inside
    try:
        outside = full.relative_to(prefix).as_posix()
    except ValueError:
        return None
    parts = outside.split("/")
    if parts[0] in ("bin", "Scripts") and len(parts) == 2:
        stem = parts[1][:-4] if parts[1].endswith(".exe") else parts[1]
        return None if stem in scripts else f"{data_dir}/scripts/{parts[1]}"
    if parts[0] == "include" and len(parts) >= 4 and parts[1] == "site":
        return f"{data_dir}/headers/{'/'.join(parts[4:]) or parts[-1]}"
    return f"{data_dir}/data/{outside}"


def repack(dist: InstalledDist, site: Path, prefix: Path, out_dir: Path) -> Path:
    """Write ``dist`` (installed under ``site`` of the venv at ``prefix``) back into a wheel in
    ``out_dir``; returns its path. The files are the installed bytes (scripts get their
    ``#!python`` shebang back); installer-made files (RECORD, INSTALLER, byte code, entry-point
    launchers) are left out and a fresh RECORD is written."""
    wheel_file = dist.dist_info / "WHEEL"
    if not wheel_file.is_file():
        raise BundleError(
            f"{dist.name} {dist.version} has no WHEEL file in {dist.dist_info}; reinstall the "
            "rollout environment with uv sync"
        )
    tags = _wheel_tags(wheel_file.read_text(encoding="utf-8"))
    filename = f"{normalize_name(dist.name)}-{dist.version.replace('-', '_')}-{tags}.whl"
    scripts = _entry_point_scripts(dist.dist_info)
    with (dist.dist_info / "RECORD").open(newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle) if row]
    members: dict[str, Path] = {}
    for row in rows:
        arcname = _arcname(dist, site, prefix, row[0], scripts)
        if arcname is None:
            continue
        full = Path(os.path.normpath(site / row[0]))
        if not full.is_file():
            raise BundleError(
                f"{dist.name} {dist.version} is incomplete ({full} is missing); re-sync the "
                "rollout environment (uv sync --reinstall-package "
                f"{dist.name})"
            )
        members[arcname] = full
    dist_info_prefix = dist.dist_info.name + "/"
    ordered = sorted(members, key=lambda a: (a.startswith(dist_info_prefix), a))
    record_rows: list[list[str]] = []
    target = out_dir / filename
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for arcname in ordered:
            data = members[arcname].read_bytes()
            if ".data/scripts/" in arcname:
                data = _restore_shebang(data)
            info = zipfile.ZipInfo(arcname, _ZIP_EPOCH)
            info.external_attr = (members[arcname].stat().st_mode & 0xFFFF) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
            digest = hashlib.sha256(data).digest()
            encoded = _urlsafe_b64(digest)
            record_rows.append([arcname, f"sha256={encoded}", str(len(data))])
        record_name = f"{dist_info_prefix}RECORD"
        record_rows.append([record_name, "", ""])
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(record_rows)
        info = zipfile.ZipInfo(record_name, _ZIP_EPOCH)
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, buffer.getvalue())
    return target


def _urlsafe_b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def uv_build_wheel(uv: str, source: Path, out_dir: Path, *, python: Path, what: str) -> Path:
    """``uv build --wheel`` of ``source`` into ``out_dir`` (offline first: the build backend is
    normally in uv's cache already; online only if that fails). Returns the wheel's path."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    env["UV_PYTHON_DOWNLOADS"] = "never"
    base = [uv, "build", "--wheel", "--python", str(python), "--out-dir", str(out_dir), str(source)]
    result: subprocess.CompletedProcess[bytes] | None = None
    for extra in (["--offline"], []):
        before = set(out_dir.glob("*.whl"))
        try:
            result = subprocess.run(
                [*base[:2], *extra, *base[2:]],
                capture_output=True,
                env=env,
                timeout=600,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BundleError(f"uv build of {what} ({source}) could not run: {exc}") from exc
        if result.returncode == 0:
            made = sorted(set(out_dir.glob("*.whl")) - before)
            if len(made) == 1:
                return made[0]
            raise BundleError(f"uv build of {what} ({source}) made {len(made)} wheels, expected 1")
    assert result is not None
    last = _last_line(result.stderr.decode("utf-8", "replace"))
    raise BundleError(f"uv build of {what} ({source}) failed: {last}; fix the build and retry")


def find_uv(explicit: str | None = None) -> str:
    """The host's uv: ``explicit``, ``$UV``, ``uv`` on PATH, then next to this interpreter (where
    the ``uv`` package installs its binary), ``~/.local/bin`` and ``~/.cargo/bin``."""
    if explicit is not None:
        if os.access(explicit, os.X_OK) and Path(explicit).is_file():
            return explicit
        raise BundleError(f"uv={explicit!r} is not an executable file; pass the path of uv")
    candidates = [os.environ.get("UV", ""), shutil.which("uv") or ""]
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(str(Path(scripts) / "uv"))
    candidates += [
        str(Path(sys.executable).parent / "uv"),
        str(Path.home() / ".local" / "bin" / "uv"),
        str(Path.home() / ".cargo" / "bin" / "uv"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise BundleError(
        "uv is needed to build the sandbox bundle and was not found; install uv or set UV to "
        "its path"
    )
