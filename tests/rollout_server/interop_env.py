"""A cached Python 3.12 virtual environment with osmosis-ai 0.3.8 (interop test, benchmark).

The environment lives at ``~/.cache/rollbridge/interop-osmosis-0.3.8-py312``. It is built once
(into a temporary sibling directory, then renamed, so an interrupted build never looks valid),
checked on every use, and rebuilt when the check fails. ``extras`` adds osmosis-ai extras
(the benchmark needs ``server`` for the reference FastAPI server, the upload test ``eval``); they are installed into the
same environment on demand.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

OSMOSIS_VERSION = "0.3.8"
ENV_DIR = Path.home() / ".cache" / "rollbridge" / f"interop-osmosis-{OSMOSIS_VERSION}-py312"

_CHECKS = {
    "": "import osmosis_ai.rollout.client",
    "server": "import fastapi, uvicorn, osmosis_ai.rollout.server",
    # `osmosis eval upload` imports the local-eval runner (tests/upload/test_interop.py).
    "eval": "import osmosis_ai.eval.local.runner, osmosis_ai.platform.cli.eval_upload",
}


class NoPython312(RuntimeError):
    """No Python 3.12 interpreter on this machine."""


def find_python312() -> str:
    """``$(pyenv prefix 3.12.1)/bin/python``, else any ``python3.12`` on PATH."""
    pyenv = shutil.which("pyenv")
    candidates = []
    if pyenv:
        for version in ("3.12.1", "3.12"):
            result = subprocess.run(
                [pyenv, "prefix", version], capture_output=True, text=True, check=False
            )
            if result.returncode == 0 and result.stdout.strip():
                candidates.append(Path(result.stdout.strip().splitlines()[0]) / "bin" / "python")
    on_path = shutil.which("python3.12")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    raise NoPython312("no Python 3.12 found (tried `pyenv prefix 3.12.1` and python3.12 on PATH)")


def _check(python: Path, extras: tuple[str, ...]) -> bool:
    if not python.exists():
        return False
    code = "; ".join(
        [
            "import importlib.metadata as m",
            f"assert m.version('osmosis-ai') == {OSMOSIS_VERSION!r}",
            *(_CHECKS[e] for e in ("", *extras)),
        ]
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, check=False)
    return result.returncode == 0


def _pip_install(python: Path, extras: tuple[str, ...]) -> None:
    spec = f"osmosis-ai[{','.join(extras)}]" if extras else "osmosis-ai"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{spec}=={OSMOSIS_VERSION}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def interop_python(extras: tuple[str, ...] = ()) -> str:
    """The environment's interpreter, building or repairing the environment when needed.

    Holds an exclusive lock meanwhile, so concurrent test runs and benchmarks never build (or
    delete) the environment under each other.
    """
    ENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    with open(ENV_DIR.parent / f".{ENV_DIR.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _locked_interop_python(extras)


def build_then_rename(target: Path, build: Callable[[Path], None]) -> None:
    """Run ``build(directory)`` on a fresh temporary sibling of ``target`` (which does not exist
    yet when ``build`` is called), then put it in ``target``'s place: an interrupted build never
    looks valid, and a failed one leaves nothing behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=target.name + ".build-", dir=target.parent))
    try:
        building.rmdir()
        build(building)
        if target.exists():
            shutil.rmtree(target)
        os.rename(building, target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def _locked_interop_python(extras: tuple[str, ...]) -> str:
    python = ENV_DIR / "bin" / "python"
    if _check(python, extras):
        return str(python)
    if _check(python, ()):
        _pip_install(python, extras)
        if _check(python, extras):
            return str(python)
    base = find_python312()

    def build(building: Path) -> None:
        # Only `python -m ...` is ever run, so the scripts' embedded paths do not matter.
        subprocess.run([base, "-m", "venv", str(building)], check=True)
        _pip_install(building / "bin" / "python", extras)

    build_then_rename(ENV_DIR, build)
    if not _check(python, extras):
        raise RuntimeError(f"could not build a working osmosis-ai environment at {ENV_DIR}")
    return str(python)
