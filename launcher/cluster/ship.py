"""Shipping the rollout to the other nodes: its offline bundle, and a venv built from it per node.

On the head, :func:`pack` makes (once per run, the first time another node wants a replica) the
rollout's offline bundle with :func:`rollout_server.harbor.bundle.build_bundle`, the same packer
as the Harbor sandbox path: the rollout's files as a small package, rollbridge's own wheel (the
self-wheel the supervisor hands to ``uv sync``), and a wheel of every distribution of the
rollout's synced venv. Its ``wheels/`` and manifest go into one tar (the bundle's copy of the
``uv`` binary stays home: each node uses the uv of its own rollbridge install).

How the tar travels: through Ray's object store (one ``ray.put`` per run), its reference handed
to each agent nested in a list, so Ray does not resolve it before the call and an agent fetches
the bytes only when its node lacks that digest. Not a ``runtime_env`` ``working_dir``: that is
fixed per job at ``ray.init`` (before we know whether any other node exists), unpacked for every
worker of the job including the head's (whose replica keeps the synced environment), capped at
500 MiB, and cached in Ray's session directory, not across runs. The object store has no such
cap, and nothing of the run goes into a ``runtime_env``, so no secret can end up in one.

On a node, :func:`ensure_env` keeps ``<cache>/<digest>/`` (``$ROLLBRIDGE_NODE_CACHE``, default
``~/.cache/rollbridge/node-envs``): the unpacked bundle, a venv built from it with ``uv venv`` and
``uv pip install --offline --no-index --find-links`` (``UV_OFFLINE=1``; no node needs the
package index), and a ``ready.json`` written last. An exclusive ``flock`` on ``<digest>.build``
serialises the agents of one node (two runs on the same bundle: one builds, the other waits and
reuses it); a directory without ``ready.json`` is a crashed build and is made again. An agent
holds its environment (a shared lock on ``<digest>.lock``,
:mod:`rollout_server.harbor.cachekeep`) for its life, and each build prunes the cache to the
:data:`KEEP` most recently used environments (``$ROLLBRIDGE_NODE_CACHE_KEEP``) and the held ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
import trio

from launcher.cluster.flags import without_ray_vars
from launcher.dispatch import LogFn
from rollout_server.harbor.bundle import MANIFEST, build_bundle
from rollout_server.harbor.cachekeep import Hold, Pruned, hold, keep_count, prune

__all__ = [
    "CACHE_ENV",
    "NodeEnv",
    "ShipError",
    "ShipInfo",
    "Shipment",
    "default_node_cache",
    "ensure_env",
    "pack",
]

#: Where a node keeps its rollout environments (read on the node, by its agent).
CACHE_ENV = "ROLLBRIDGE_NODE_CACHE"
#: Environments a node keeps besides the held ones (``$ROLLBRIDGE_NODE_CACHE_KEEP``, >= 1).
KEEP = 5
KEEP_ENV = "ROLLBRIDGE_NODE_CACHE_KEEP"
READY = "ready.json"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_UV_TIMEOUT_S = 600.0


class ShipError(RuntimeError):
    """The rollout cannot be shipped or its environment built; the message is one line."""


class ShipInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent needs to know of the shipped bundle (an actor argument, in the spec)."""

    digest: str
    requirement: str
    package_dir_name: str
    python: str
    """The major.minor of the head's rollout venv (its compiled wheels are for that Python)."""
    entrypoint: str
    """The entrypoint relative to the rollout directory (and so to the staged package)."""
    sha256: str
    """Of the tar, checked before it is unpacked."""


@dataclass(frozen=True)
class NodeEnv:
    """A rollout environment built on this node from a shipped bundle."""

    python: Path
    rollout_dir: Path
    """The installed copy of the rollout's files (the server's working directory)."""
    entrypoint: Path
    built: bool
    """Whether this call built it (False: an earlier run's environment, reused)."""
    bundle: Path
    """The unpacked bundle, with this node's uv: a complete sandbox bundle for a Harbor replica
    (:data:`rollout_server.harbor.bundle.SHIPPED_BUNDLE_ENV`)."""
    hold: Hold | None = None
    """Its use lock: the cache is not pruned of it while held (the agent's life)."""
    pruned: Pruned = field(default_factory=Pruned)
    """What this call's build pruned from the cache."""


def pack(
    rollout_dir: Path, python: Path, entrypoint: Path, wheelhouse: Path | None
) -> tuple[ShipInfo, bytes]:
    """The bundle of the rollout at ``rollout_dir`` (venv interpreter ``python``) and its tar.
    Blocking (it may build wheels): call it on a worker thread."""
    try:
        bundle = build_bundle(rollout_dir, python=python, wheelhouse=wheelhouse)
        try:
            manifest = json.loads((bundle.directory / MANIFEST).read_bytes())
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                tar.add(bundle.directory / MANIFEST, arcname=MANIFEST)
                tar.add(bundle.directory / "wheels", arcname="wheels")
        finally:
            if bundle.hold is not None:  # the tar is made: the cache may prune it from now on
                bundle.hold.release()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ShipError(f"cannot bundle the rollout for the other nodes: {exc}") from None
    data = buffer.getvalue()
    info = ShipInfo(
        digest=bundle.digest,
        requirement=bundle.requirement,
        package_dir_name=bundle.package_dir_name,
        python=str(manifest.get("python", "")),
        entrypoint=entrypoint.relative_to(rollout_dir).as_posix(),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return info, data


def _wheelhouse(uv: Path) -> Path | None:
    """The directory of this rollbridge's own wheel (None: the bundle repacks the venv's)."""
    from launcher.selfwheel import SelfWheelError, self_wheel

    try:
        return self_wheel(uv)
    except SelfWheelError:
        return None


class Shipment:
    """The run's bundle on the head: packed and put in the object store on first use, once."""

    def __init__(
        self,
        ray: Any,
        rollout_dir: Path,
        python: Path,
        entrypoint: Path,
        uv: Path,
        log: LogFn,
    ) -> None:
        self._ray = ray
        self._log = log
        self._args = (rollout_dir, python, entrypoint)
        self._uv = uv
        self._lock = trio.Lock()
        self._packed: tuple[ShipInfo, list[Any]] | None = None
        self._error: ShipError | None = None

    async def get(self) -> tuple[ShipInfo, list[Any]]:
        """The bundle's facts and its object-store reference (nested in a list, for the agent).
        Raises :class:`ShipError` (every time, once it failed)."""
        async with self._lock:
            if self._error is not None:
                raise self._error
            if self._packed is None:
                try:
                    wheelhouse = await trio.to_thread.run_sync(_wheelhouse, self._uv)
                    info, data = await trio.to_thread.run_sync(pack, *self._args, wheelhouse)
                except ShipError as exc:
                    self._error = exc
                    raise
                ref = await trio.to_thread.run_sync(self._ray.put, data)
                self._packed = (info, [ref])
                details = {"bundle": info.digest, "bytes": len(data)}
                self._log("INFO", "cluster", "rollout bundle shipped", details)
            return self._packed


def default_node_cache() -> Path:
    """``$ROLLBRIDGE_NODE_CACHE``, else ``~/.cache/rollbridge/node-envs``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    return Path.home() / ".cache" / "rollbridge" / "node-envs"


def ensure_env(info: ShipInfo, fetch: Callable[[], bytes], root: Path | None = None) -> NodeEnv:
    """The environment of ``info``'s bundle under ``root``: reused when ready, else built from
    ``fetch()`` (called only then). Blocking; safe against other agents on this node. Raises
    :class:`ShipError` with a one-line cause."""
    if not _DIGEST.match(info.digest):
        raise ShipError(f"malformed bundle digest {info.digest[:80]!r}")
    root = root if root is not None else default_node_cache()
    directory = root / info.digest
    try:
        root.mkdir(parents=True, exist_ok=True)
        held = hold(root, info.digest)  # before the lookup: a prune cannot take it once found
    except OSError as exc:
        raise ShipError(f"cannot build the rollout environment under {root}: {exc}") from None
    try:
        found = _ready(directory, info)
        if found is not None:
            return replace(found, hold=held)
        with _locked(root / f"{info.digest}.build"):
            found = _ready(directory, info)
            if found is not None:
                return replace(found, hold=held)
            shutil.rmtree(directory, ignore_errors=True)
            try:
                built = _build(info, fetch(), directory)
            except BaseException:
                shutil.rmtree(directory, ignore_errors=True)
                raise
    except BaseException as exc:
        held.abandon(directory)
        if isinstance(exc, (OSError, tarfile.TarError)):
            raise ShipError(f"cannot build the rollout environment under {root}: {exc}") from None
        raise
    pruned = prune(root, keep_count(KEEP_ENV, KEEP), current=info.digest)
    return replace(built, hold=held, pruned=pruned)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ready(directory: Path, info: ShipInfo) -> NodeEnv | None:
    try:
        facts = json.loads((directory / READY).read_bytes())
        python, rollout_dir = Path(facts["python"]), Path(facts["rollout_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    entrypoint = rollout_dir / info.entrypoint
    if not python.exists() or not entrypoint.is_file():
        return None
    _link_uv(python.parent)
    return NodeEnv(python, rollout_dir, entrypoint, built=False, bundle=directory / "bundle")


def _link_uv(bin_dir: Path) -> None:
    """``uv`` beside the venv's interpreter and in the unpacked bundle: this node's uv, for
    what a Harbor replica does with it (:func:`rollout_server.harbor.bundle.find_uv` looks beside
    the interpreter; a sandbox image installs the bundle with the bundle's ``uv``). Best effort,
    and done again when an environment is reused."""
    bundle_uv = bin_dir.parent.parent / "bundle" / "uv"
    with contextlib.suppress(OSError, ShipError):
        if not (bin_dir / "uv").is_file():
            (bin_dir / "uv").unlink(missing_ok=True)
            (bin_dir / "uv").symlink_to(_uv())
        if not bundle_uv.is_file():
            # A copy, not a link: it goes into the image's build context.
            scratch = bundle_uv.with_name(f".uv.{os.getpid()}")
            shutil.copy2(_uv(), scratch)
            os.replace(scratch, bundle_uv)


def _uv() -> str:
    """The uv of this node's rollbridge install (the ``uv`` package is a dependency)."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise ShipError(
            "this node's rollbridge install has no uv; reinstall rollbridge[ray] on it"
        ) from None


def _run(command: list[str], what: str) -> str:
    env = {k: v for k, v in without_ray_vars(os.environ).items() if not k.startswith("VIRTUAL_ENV")}
    env |= {"UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CACHE": "1"}
    try:
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=_UV_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShipError(f"{what} failed: {exc}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        cause = "; ".join(lines)[:400] if lines else f"exit {done.returncode}"
        raise ShipError(f"{what} failed: {cause}")
    return done.stdout


def _interpreter(wanted: str) -> str:
    """This agent's interpreter when it is the bundle's Python, else ``major.minor`` for uv
    to find among the node's interpreters (never downloaded)."""
    if wanted in ("", f"{sys.version_info[0]}.{sys.version_info[1]}"):
        return sys.executable
    return wanted


def _build(info: ShipInfo, data: bytes, directory: Path) -> NodeEnv:
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise ShipError("the shipped bundle does not match its digest; rerun")
    bundle = directory / "bundle"
    bundle.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(bundle, filter="data")
    uv, venv = _uv(), directory / "venv"
    python = venv / "bin" / "python"
    _run(
        [uv, "venv", "--quiet", "--python", _interpreter(info.python), str(venv)],
        "uv venv for the rollout",
    )
    _run(
        [
            uv, "pip", "install", "--quiet", "--offline", "--no-index",
            "--python", str(python), "--find-links", str(bundle / "wheels"), info.requirement,
        ],
        "uv pip install of the rollout's bundle",
    )  # fmt: skip
    _link_uv(python.parent)
    probe = (
        "import importlib.util, sys; "
        "print(importlib.util.find_spec(sys.argv[1]).submodule_search_locations[0])"
    )
    located = _run([str(python), "-I", "-c", probe, info.package_dir_name], "the rollout venv")
    rollout_dir = Path(located.strip())
    entrypoint = rollout_dir / info.entrypoint
    if not entrypoint.is_file():
        raise ShipError(f"the shipped rollout has no {info.entrypoint}; is it ignored by git?")
    facts = {"python": str(python), "rollout_dir": str(rollout_dir), "digest": info.digest}
    scratch = directory / f".{READY}.tmp"
    scratch.write_text(json.dumps(facts) + "\n")
    os.replace(scratch, directory / READY)
    return NodeEnv(python, rollout_dir, entrypoint, built=True, bundle=bundle)
