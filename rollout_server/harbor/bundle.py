"""A rollout's bundle: everything its sandbox needs to run the rollout's own code offline.

:func:`build_bundle` makes, on the host and from what is already on the machine, a directory

    <cache_root>/<digest>/wheels/*.whl   the rollout project's wheel, the SDK's, every dependency's
    <cache_root>/<digest>/uv             a copy of the host's uv binary (installs them offline)
    <cache_root>/<digest>/manifest.json  digest, the venv's Python, each wheel with its sha256

The rollout project (usually ``[tool.uv] package = false``: a ``main.py`` and friends) is staged
as a small project ``rollbridge-rollout-<name>`` whose one package, ``rollbridge_rollout``, holds
a copy of the rollout's files and whose dependencies are the project's; path and editable
dependencies (the SDK from a clone) are built from source; everything else installed in the
rollout venv is repacked from its installed files (``wheelhouse.py``), except rollbridge itself
when the supervisor hands over its own wheel of the same version (``ROLLBRIDGE_WHEELHOUSE``):
the sandbox then runs the installed rollbridge, never a checkout. The digest covers the
rollout's files, the source-built dependencies' trees, each repacked distribution (name, version,
RECORD hash), the venv's Python major.minor and :data:`FORMAT`, so an unchanged rollout finds its
bundle again without building anything. :func:`ensure_image` (``image.py``) turns a bundle and a
task's ``environment/`` into a sandbox image.

The cache keeps the :data:`KEEP` most recently used bundles: each build prunes the others that
no live process holds (:mod:`.cachekeep`; a bundle found or built is held by the process that
asked for it until it exits or releases :attr:`Bundle.hold`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .cachekeep import Hold, hold, keep_count, prune
from .wheelhouse import (
    BundleError,
    InstalledDist,
    file_sha256,
    find_uv,
    installed_dists,
    normalize_name,
    repack,
    source_files,
    uv_build_wheel,
    wheel_is_pure,
)

__all__ = [
    "FORMAT",
    "PACKAGE_DIR_NAME",
    "SHIPPED_BUNDLE_ENV",
    "WHEELHOUSE_ENV",
    "Bundle",
    "BundleError",
    "build_bundle",
    "default_cache_root",
    "find_uv",
    "shipped_bundle",
]

#: Bumped whenever the layout or the recipe of a bundle changes (old bundles then miss).
FORMAT = 1
#: The import package holding a copy of the rollout's files (put its directory on sys.path).
PACKAGE_DIR_NAME = "rollbridge_rollout"
MANIFEST = "manifest.json"
#: A directory with rollbridge's own wheel (the supervisor's, launcher.selfwheel.SHIPPED_ENV).
WHEELHOUSE_ENV = "ROLLBRIDGE_WHEELHOUSE"
#: A complete bundle this server's own environment was installed from (a Ray node agent sets it:
#: launcher/cluster/ship.py); the sandbox then gets exactly that bundle instead of a repack.
SHIPPED_BUNDLE_ENV = "ROLLBRIDGE_SHIPPED_BUNDLE"
#: Installed only as a tool in a venv; dropped unless something requires them.
_TOOLS = frozenset({"pip", "setuptools", "wheel"})
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_DIRECT_REF = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*\s*(?:\[[^\]]*\])?)\s*@[^;]*(;.*)?$")
_VENV_PROBE = (
    "import json, sys, sysconfig; p = sysconfig.get_paths(); "
    "print(json.dumps({'purelib': p['purelib'], 'platlib': p['platlib'], 'prefix': sys.prefix, "
    "'version': '%d.%d.%d' % sys.version_info[:3]}))"
)


@dataclass(frozen=True)
class Bundle:
    """A built wheelhouse (see the module docstring for ``directory``'s layout)."""

    digest: str
    directory: Path
    #: The distribution to install (``uv pip install <requirement>`` pulls in the rest).
    requirement: str
    #: The import package whose directory holds the rollout's files (``import main`` from there).
    package_dir_name: str
    #: Its use lock (:mod:`.cachekeep`): released with the process or by a caller done with it.
    hold: Hold | None = field(default=None, compare=False, repr=False)


#: Bundles kept in the cache besides held ones (``$ROLLBRIDGE_BUNDLE_KEEP``, >= 1).
KEEP = 5
KEEP_ENV = "ROLLBRIDGE_BUNDLE_KEEP"


def default_cache_root() -> Path:
    """``~/.cache/rollbridge/bundles``."""
    return Path.home() / ".cache" / "rollbridge" / "bundles"


def _read_project(project_dir: Path) -> dict[str, Any]:
    pyproject = project_dir / "pyproject.toml"
    if not pyproject.is_file():
        raise BundleError(
            f"{project_dir} has no pyproject.toml; the in-sandbox agent needs the rollout's "
            "project directory (the one with pyproject.toml and main.py)"
        )
    try:
        document = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BundleError(f"cannot read {pyproject}: {exc}") from exc
    project = document.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("name"), str):
        raise BundleError(f"{pyproject} has no [project] name; add one")
    return project


def _venv_facts(python: Path) -> dict[str, str]:
    try:
        probe = subprocess.run(
            [str(python), "-I", "-c", _VENV_PROBE],
            capture_output=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"the rollout interpreter {python} cannot run: {exc}") from exc
    if probe.returncode != 0:
        last = (probe.stderr.decode("utf-8", "replace").strip().splitlines() or ["?"])[-1]
        raise BundleError(f"the rollout interpreter {python} failed: {last}")
    facts: dict[str, str] = json.loads(probe.stdout)
    return facts


def _strip_direct_reference(requirement: str) -> str:
    """``name[extra] @ url ; marker`` → ``name[extra] ; marker`` (the wheelhouse has the wheel)."""
    match = _DIRECT_REF.match(requirement)
    if match is None:
        return requirement.strip()
    return match.group(1).strip() + (f" {match.group(2).strip()}" if match.group(2) else "")


def _requirement_names(requirements: Sequence[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        match = _NAME.match(requirement)
        if match:
            names.add(normalize_name(match.group(1)))
    return names


def _project_files(project_dir: Path) -> list[str]:
    # .env files are where secrets live; a sandbox never gets them.
    return [
        name
        for name in source_files(project_dir, use_git=True)
        if not re.fullmatch(r"\.env(\..*)?", name.rsplit("/", 1)[-1])
    ]


class _Plan:
    """What a bundle is made of, and its digest (computed without building anything)."""

    def __init__(self, project_dir: Path, python: Path, wheelhouse: Path | None = None) -> None:
        self.project_dir = project_dir
        self.python = python
        self.project = _read_project(project_dir)
        self.name = str(self.project["name"])
        version = self.project.get("version")
        self.version = version if isinstance(version, str) else "0.0.0"
        facts = _venv_facts(python)
        self.python_version = facts["version"]
        self.major_minor = ".".join(self.python_version.split(".")[:2])
        self.site = Path(facts["purelib"])
        self.prefix = Path(facts["prefix"])
        dists = installed_dists([self.site, Path(facts["platlib"])])
        self.project_files = _project_files(project_dir)
        self.dependencies = [
            _strip_direct_reference(d) for d in self.project.get("dependencies", []) or []
        ]
        self.source: list[InstalledDist] = []
        self.own: InstalledDist | None = None
        self.shipped = _shipped(wheelhouse, dists)
        repacked = []
        for dist in dists:
            if dist.key in self.shipped:
                continue
            if dist.source_dir is None:
                repacked.append(dist)
                continue
            if not dist.source_dir.is_dir():
                raise BundleError(
                    f"{dist.name} is installed from {dist.source_dir}, which no longer exists; "
                    "re-sync the rollout environment (uv sync)"
                )
            if dist.source_dir.resolve() == project_dir:
                self.own = dist
            self.source.append(dist)
        needed = _requirement_names(self.dependencies)
        for dist in dists:
            needed |= _requirement_names(dist.requires)
        self.repacked = [d for d in repacked if d.key not in _TOOLS or d.key in needed]
        self.requirement = "rollbridge-rollout-" + (
            re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or "rollout"
        )
        self.digest = self._digest()

    def _digest(self) -> str:
        h = hashlib.sha256()

        def line(*parts: str) -> None:
            h.update(("\0".join(parts) + "\n").encode("utf-8", "surrogateescape"))

        line("format", str(FORMAT))
        line("python", self.major_minor)
        line("project", self.name, self.version)
        for name in self.project_files:
            line("file", name, file_sha256(self.project_dir / name))
        for dist in self.source:
            assert dist.source_dir is not None
            line("source", dist.key, dist.version)
            for name in source_files(dist.source_dir, use_git=True):
                line("source-file", dist.key, name, file_sha256(dist.source_dir / name))
        for dist in self.repacked:
            line("dist", f"{dist.key}=={dist.version}", dist.record_sha256)
        for key, (version, wheel) in sorted(self.shipped.items()):
            line("shipped", f"{key}=={version}", file_sha256(wheel))
        return h.hexdigest()


def _shipped(
    wheelhouse: Path | None, dists: Sequence[InstalledDist]
) -> dict[str, tuple[str, Path]]:
    """rollbridge's wheel from ``wheelhouse`` (the supervisor's own, launcher.selfwheel), when
    it is the version the rollout venv has: the sandbox then runs the installed rollbridge, not
    a checkout a path source points at. Keyed by normalized name."""
    if wheelhouse is None:
        return {}
    found: dict[str, tuple[str, Path]] = {}
    for dist in dists:
        if dist.key != "rollbridge":
            continue
        prefix = f"rollbridge-{dist.version.replace('-', '_')}-"
        wheels = sorted(p for p in wheelhouse.glob("rollbridge-*.whl") if p.name.startswith(prefix))
        if wheels:
            found[dist.key] = (dist.version, wheels[-1])
    return found


def _stage_project(plan: _Plan, root: Path) -> Path:
    staged = root / "rollout-project"
    package = staged / PACKAGE_DIR_NAME
    package.mkdir(parents=True)
    for name in plan.project_files:
        target = package / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(plan.project_dir / name, target)
    if not (package / "__init__.py").exists():
        (package / "__init__.py").write_text('"""The rollout\'s files, staged by rollbridge."""\n')
    dependencies = list(plan.dependencies)
    if plan.own is not None:
        dependencies.append(plan.own.name)
    lines = [
        "[build-system]",
        'requires = ["hatchling>=1.24"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        f"name = {json.dumps(plan.requirement)}",
        f"version = {json.dumps(plan.version)}",
        f"dependencies = {json.dumps(dependencies)}",
    ]
    requires_python = plan.project.get("requires-python")
    if isinstance(requires_python, str):
        lines.append(f"requires-python = {json.dumps(requires_python)}")
    lines += ["", "[tool.hatch.build.targets.wheel]", f'packages = ["{PACKAGE_DIR_NAME}"]', ""]
    (staged / "pyproject.toml").write_text("\n".join(lines))
    return staged


def _cached(directory: Path, digest: str) -> Bundle | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("digest") != digest:
        return None
    requirement, package = manifest.get("requirement"), manifest.get("package_dir_name")
    if not isinstance(requirement, str) or not isinstance(package, str):
        return None
    if not (directory / "uv").is_file():
        return None
    return Bundle(digest, directory, requirement, package)


def shipped_bundle() -> Bundle | None:
    """The bundle ``$SHIPPED_BUNDLE_ENV`` names, when it is complete (None otherwise).

    A replica on another Ray node runs from a venv installed from the head's bundle: that venv
    holds the rollout's files as an installed package, and bundling it again would pack them
    twice. The shipped bundle is the head's own, so the sandbox image is the head's too."""
    named = os.environ.get(SHIPPED_BUNDLE_ENV)
    if not named:
        return None
    directory = Path(named)
    try:
        digest = json.loads((directory / MANIFEST).read_bytes()).get("digest")
    except (OSError, ValueError, AttributeError):
        return None
    return _cached(directory, digest) if isinstance(digest, str) else None


def _build(plan: _Plan, uv: str, scratch: Path, log: Callable[[str], None]) -> None:
    wheels = scratch / "wheels"
    wheels.mkdir()
    entries: list[dict[str, Any]] = []

    def add(path: Path, name: str, version: str, kind: str) -> None:
        entries.append(
            {
                "file": path.name,
                "sha256": file_sha256(path),
                "name": name,
                "version": version,
                "kind": kind,
                "pure": wheel_is_pure(path.name),
            }
        )

    with tempfile.TemporaryDirectory(dir=scratch.parent, prefix=".stage-") as tmp:
        staged = _stage_project(plan, Path(tmp))
        wheel = uv_build_wheel(
            uv, staged, wheels, python=plan.python, what=f"the rollout {plan.name}"
        )
        add(wheel, plan.requirement, plan.version, "project")
    for dist in plan.source:
        assert dist.source_dir is not None
        wheel = uv_build_wheel(uv, dist.source_dir, wheels, python=plan.python, what=dist.name)
        add(wheel, dist.name, dist.version, "source")
    for dist in plan.repacked:
        add(repack(dist, plan.site, plan.prefix, wheels), dist.name, dist.version, "repacked")
    for key, (version, wheel) in plan.shipped.items():
        shutil.copy2(wheel, wheels / wheel.name)
        add(wheels / wheel.name, key, version, "shipped")
    shutil.copy2(uv, scratch / "uv")
    os.chmod(scratch / "uv", 0o755)
    for stray in wheels.iterdir():
        if not stray.name.endswith(".whl"):
            stray.unlink()
    manifest = {
        "format": FORMAT,
        "digest": plan.digest,
        "project": plan.name,
        "requirement": plan.requirement,
        "package_dir_name": PACKAGE_DIR_NAME,
        "python": plan.major_minor,
        "python_full": plan.python_version,
        "wheels": sorted(entries, key=lambda e: str(e["file"])),
    }
    (scratch / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"bundle: {len(entries)} wheels for {plan.name} (python {plan.major_minor})")


def build_bundle(
    project_dir: Path,
    *,
    python: Path,
    cache_root: Path | None = None,
    uv: str | None = None,
    log: Callable[[str], None] | None = None,
    wheelhouse: Path | None = None,
) -> Bundle:
    """The bundle of the rollout project at ``project_dir`` whose venv interpreter is
    ``python``: found in ``cache_root`` (default :func:`default_cache_root`) by digest, else built
    and published there atomically. Blocking: call it through ``trio.to_thread.run_sync``.
    Raises :class:`BundleError` (a one-line message) when it cannot be made.

    ``wheelhouse`` (default: ``$ROLLBRIDGE_WHEELHOUSE``, which the supervisor sets to the
    directory of its own wheel) supplies rollbridge's wheel when it holds the venv's version."""
    emit = log or (lambda _line: None)
    started = time.monotonic()
    project_dir = Path(project_dir).resolve()
    if wheelhouse is None and os.environ.get(WHEELHOUSE_ENV):
        wheelhouse = Path(os.environ[WHEELHOUSE_ENV])
    plan = _Plan(project_dir, Path(python), wheelhouse)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    directory = root / plan.digest
    try:
        root.mkdir(parents=True, exist_ok=True)
        # Held before the lookup, so a prune cannot take the bundle once found (cachekeep).
        held = hold(root, plan.digest)
    except OSError as exc:
        raise BundleError(f"cannot use the bundle cache {root}: {exc}") from exc
    try:
        found = _cached(directory, plan.digest)
        if found is not None:
            emit(f"bundle: {plan.digest[:12]} cached ({time.monotonic() - started:.2f} s)")
            return replace(found, hold=held)
        built = _publish(plan, root, directory, find_uv(uv), emit)
    except BaseException:
        held.abandon(directory)
        raise
    emit(f"bundle: {plan.digest[:12]} built in {time.monotonic() - started:.1f} s")
    keep = keep_count(KEEP_ENV, KEEP)
    if (pruned := prune(root, keep, current=plan.digest)).entries:
        emit(f"bundle cache: kept {keep}, removed {pruned.entries} ({pruned.bytes >> 20} MiB)")
    return replace(built, hold=held)


def _publish(
    plan: _Plan, root: Path, directory: Path, uv_path: str, emit: Callable[[str], None]
) -> Bundle:
    """Build ``plan`` in a scratch directory and rename it to ``directory`` (atomic)."""
    if directory.exists():
        # Another builder may have published it meanwhile; otherwise it is a broken leftover.
        found = _cached(directory, plan.digest)
        if found is not None:
            return found
        shutil.rmtree(directory, ignore_errors=True)
    try:
        scratch = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{plan.digest[:12]}-"))
        try:
            _build(plan, uv_path, scratch, emit)
            try:
                os.rename(scratch, directory)
            except OSError:
                # Another builder published the same digest first: theirs is as good as ours.
                if _cached(directory, plan.digest) is None:
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except OSError as exc:
        raise BundleError(f"cannot write the bundle under {root}: {exc}") from exc
    built = _cached(directory, plan.digest)
    assert built is not None
    return built
