"""The cached install of the reference (osmosis-ai 0.3.8) and the workspace its CLI runs in.

Built once under ``~/.cache/rollbridge/bench-reference/`` by :func:`ensure_reference`, under a
lock, so concurrent benchmarks never build under each other:

- ``env-osmosis-0.3.8-py312``: a Python 3.12 virtual environment with ``osmosis-ai[eval]==0.3.8``
  (the ``eval`` extra brings LiteLLM, uv and the server stack the CLI needs). It is separate
  from the interoperability tests' environment (``tests/rollout_server/interop_env.py``), whose
  package set those tests rely on; only its Python 3.12 lookup is shared. Built under a
  temporary name and renamed, so an interrupted build never looks valid; only ``python -m ...``
  and the uv binary are run from it, so the scripts' embedded build paths do not matter.
- ``workspace``: the layout the reference CLI insists on: a Git worktree top holding
  ``rollouts/``, ``configs/eval/``, ``configs/training/`` and ``data/``. ``rollouts/echo`` is
  ``scripts/bench/reference_rollout`` (a uv project depending on ``osmosis-ai[server]==0.3.8``
  and an echo rollout on the reference's own SDK). The workspace is published by a rename too;
  its ``uv sync`` (the only step that needs the package registry) runs after that, and the
  ``.bench-ready`` marker (the hash of what the workspace was built from) is written only once
  the synced environment answers, so an interrupted sync, or a changed rollout, rebuilds it.

Later runs need no network: the reference's own ``uv sync`` at each run works from the lock
and the uv cache (``uv_env(offline=True)`` sets ``UV_OFFLINE=1``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.rollout_server.interop_env import build_then_rename, find_python312  # noqa: E402

REFERENCE_VERSION = "0.3.8"
CACHE = Path.home() / ".cache" / "rollbridge" / "bench-reference"
ENV_DIR = CACHE / f"env-osmosis-{REFERENCE_VERSION}-py312"
WORKSPACE = CACHE / "workspace"
ROLLOUT_SOURCE = Path(__file__).resolve().parent / "reference_rollout"
ROLLOUT_FILES = ("pyproject.toml", "main.py")

GITIGNORE = """\
.bench-ready*
.venv/
.osmosis/
__pycache__/
data/*.jsonl
configs/eval/bench-*.toml
"""

_ENV_CHECK = (
    "import importlib.metadata as m; "
    f"assert m.version('osmosis-ai') == {REFERENCE_VERSION!r}; "
    "import litellm, fastapi, uvicorn, osmosis_ai.eval.local.runner"
)
_ROLLOUT_CHECK = (
    "import importlib.metadata as m; "
    f"assert m.version('osmosis-ai') == {REFERENCE_VERSION!r}; "
    "import httpx, uvicorn, osmosis_ai.rollout.server.app"
)

#: Left out of the reference's environment, as our benchmark leaves them out of ours.
#: ``PYTHONDONTWRITEBYTECODE`` would make every process compile every module at each start.
_UNWARM = frozenset({"VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "OPENAI_API_BASE"})


class ReferenceUnavailable(RuntimeError):
    """The reference could not be installed or its workspace could not be built."""


@dataclass(frozen=True)
class ReferenceSetup:
    """The cached reference: its interpreter, its workspace and what building them took."""

    python: Path
    workspace: Path
    python312: Path
    build_s: float
    """Seconds spent building in this call (0.0 when everything was cached)."""


def build_key() -> str:
    """Identifies what the workspace is built from: a change to any of it rebuilds it."""
    digest = hashlib.sha256(f"{REFERENCE_VERSION}\0{GITIGNORE}".encode())
    for name in ROLLOUT_FILES:
        digest.update(b"\0" + (ROLLOUT_SOURCE / name).read_bytes())
    return digest.hexdigest()


def uv_env(python312: str, *, offline: bool) -> dict[str, str]:
    """This process's environment for uv and the reference, pinned to ``python312``."""
    env = {k: v for k, v in os.environ.items() if k not in _UNWARM}
    # The rollout env must use this machine's 3.12 (uv would otherwise try to download one).
    env.update(UV_PYTHON=python312, UV_PYTHON_DOWNLOADS="never")
    if offline:
        env["UV_OFFLINE"] = "1"
    return env


def _run(argv: list[str], what: str, **kwargs: object) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-5:]
        raise ReferenceUnavailable(f"{what} failed (exit {result.returncode}): {' | '.join(tail)}")


def _answers(python: Path, code: str) -> bool:
    if not python.exists():
        return False
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HARBOR_TELEMETRY": "0"}
    result = subprocess.run([str(python), "-c", code], capture_output=True, check=False, env=env)
    return result.returncode == 0


def _build_env(python312: str) -> None:
    def build(building: Path) -> None:
        _run([python312, "-m", "venv", str(building)], "creating the reference's venv")
        _run(
            [
                str(building / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"osmosis-ai[eval]=={REFERENCE_VERSION}",
            ],
            f"pip install osmosis-ai[eval]=={REFERENCE_VERSION}",
        )

    build_then_rename(ENV_DIR, build)


def _build_workspace() -> None:
    def build(building: Path) -> None:
        for sub in ("rollouts/echo", "configs/eval", "configs/training", "data"):
            (building / sub).mkdir(parents=True)
        for name in ROLLOUT_FILES:
            shutil.copyfile(ROLLOUT_SOURCE / name, building / "rollouts" / "echo" / name)
        (building / ".gitignore").write_text(GITIGNORE)
        git = ["git", "-C", str(building), "-c", "user.name=bench", "-c", "user.email=bench@local"]
        _run([*git, "init", "-q", "-b", "main"], "git init of the reference workspace")
        _run([*git, "add", "-A"], "git add in the reference workspace")
        _run([*git, "commit", "-q", "-m", "reference benchmark workspace"], "git commit")

    build_then_rename(WORKSPACE, build)


def _workspace_ready(key: str) -> bool:
    marker = WORKSPACE / ".bench-ready"
    return (
        marker.exists()
        and marker.read_text() == key
        and _answers(WORKSPACE / "rollouts" / "echo" / ".venv" / "bin" / "python", _ROLLOUT_CHECK)
    )


def ensure_reference() -> ReferenceSetup:
    """Build (once) and return the cached reference; blocking (call it from a thread).

    Raises :class:`ReferenceUnavailable` with the failing step's last lines when it cannot.
    """
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    built = False
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            python312 = find_python312()
        except RuntimeError as exc:
            raise ReferenceUnavailable(str(exc)) from exc
        python = ENV_DIR / "bin" / "python"
        if not _answers(python, _ENV_CHECK):
            _build_env(python312)
            built = True
            if not _answers(python, _ENV_CHECK):
                raise ReferenceUnavailable(f"the environment at {ENV_DIR} does not work")
        key = build_key()
        if not _workspace_ready(key):
            _build_workspace()
            rollout = WORKSPACE / "rollouts" / "echo"
            _run(
                [str(ENV_DIR / "bin" / "uv"), "sync", "--project", str(rollout)],
                "uv sync of the reference rollout",
                cwd=str(rollout),
                env=uv_env(python312, offline=False),
            )
            if not _answers(rollout / ".venv" / "bin" / "python", _ROLLOUT_CHECK):
                raise ReferenceUnavailable(f"the rollout environment in {rollout} does not work")
            marker = WORKSPACE / ".bench-ready.tmp"
            marker.write_text(key)
            os.rename(marker, WORKSPACE / ".bench-ready")
            built = True
    return ReferenceSetup(
        python=python,
        workspace=WORKSPACE,
        python312=Path(python312),
        build_s=time.perf_counter() - started if built else 0.0,
    )
