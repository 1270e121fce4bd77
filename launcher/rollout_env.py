"""The rollout's own uv environment: locate ``uv``, run ``uv sync`` on the rollout project, and
find the environment's interpreter (the rollout server runs on it directly, never through
``uv run``, docs/hazards.md #3)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import trio

from launcher.errors import DependencyError, LocalEvalError
from launcher.process import STOP_GRACE_S, OutputSink, child_environment, spawn_child

__all__ = ["find_uv", "missing_path_sources", "rollout_python", "uv_error", "uv_sync"]


def find_uv(rollout: str) -> Path:
    """Locate the ``uv`` executable: next to this interpreter's scripts, then next to
    ``sys.executable``, then on ``PATH`` (``pip install rollbridge[cli]`` installs it as a
    package, so the first two places find it in a fresh virtual environment)."""
    names = ("uv.exe", "uv") if os.name == "nt" else ("uv",)
    candidates: list[Path] = []
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.extend(Path(scripts) / n for n in names)
    candidates.extend(Path(sys.executable).parent / n for n in names)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("uv")
    if found:
        return Path(found)
    raise LocalEvalError(
        f"uv is required to launch the rollout server from rollouts/{rollout}/pyproject.toml; "
        "install uv and retry"
    )


def rollout_python(rollout_dir: Path, env: Mapping[str, str]) -> Path:
    """The interpreter of the rollout's uv environment: ``rollouts/<r>/.venv`` unless
    ``UV_PROJECT_ENVIRONMENT`` moves it (uv sync honours that variable, so we must too)."""
    venv = rollout_dir / ".venv"
    moved = env.get("UV_PROJECT_ENVIRONMENT")
    if moved:
        venv = Path(moved) if os.path.isabs(moved) else rollout_dir / moved
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def missing_path_sources(rollout_dir: Path) -> list[tuple[str, str, Path]]:
    """The ``[tool.uv.sources]`` path entries of the rollout's ``pyproject.toml`` that point at
    nothing uv can install (no file there, or a directory without ``pyproject.toml`` or
    ``setup.py``): (package, path as written, resolved path). A copied example keeps its
    entry to the checkout it came from, and uv's own error ("`/` does not appear to be a Python
    project") names neither the package nor the entry. A file that does not parse is uv's to
    report (none)."""
    try:
        with (rollout_dir / "pyproject.toml").open("rb") as f:
            sources: Any = tomllib.load(f).get("tool", {}).get("uv", {}).get("sources", {})
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        return []
    missing = []
    for name, entries in sources.items() if isinstance(sources, dict) else ():
        for entry in entries if isinstance(entries, list) else [entries]:
            written = entry.get("path") if isinstance(entry, dict) else None
            if not isinstance(written, str):
                continue
            target = (rollout_dir / written).resolve()
            if target.is_file() or any(
                (target / n).is_file() for n in ("pyproject.toml", "setup.py")
            ):
                continue
            missing.append((name, written, target))
    return missing


#: How uv names what failed (an index URL, a distribution) in an error's chain of causes.
_WHAT_FAILED = re.compile(r"Failed to \w+:? .+")
#: How uv introduces the causes of an error (plain, older, and drawn as a tree).
_CAUSE = re.compile(r"^(?:error:|cause:|caused by:|[×╰├│─▶ ]+)\s*", re.IGNORECASE)


def uv_error(lines: Iterable[str], last_line: str) -> str:
    """What a failed ``uv sync`` said, in one line: its last line (``cause: operation timed
    out``), after the line of the same error that names what failed (``Failed to fetch:
    <url>``) when that is another line; the URL was otherwise in ``logs.txt`` only."""
    named = None
    for line in lines:
        text = line.strip()
        if text.lower().startswith("error:"):
            named = None  # an error of its own: only the last one's causes count
        found = _WHAT_FAILED.search(text)
        if found and named is None:
            named = found.group()
    if named is None or named in last_line:
        return last_line
    return f"{named}: {_CAUSE.sub('', last_line)}"


async def uv_sync(
    uv: Path,
    rollout_dir: Path,
    rollout: str,
    *,
    env: Mapping[str, str],
    sink: OutputSink,
    logs_hint: str,
    redact: Callable[[str], str],
    find_links: Path | None = None,
) -> None:
    """Run ``uv sync --project <rollout_dir>`` to completion (no timeout: the first sync may
    download a lot). Output goes to ``sink``. Cancellation stops uv's group (5 s grace).
    A non-zero exit raises :class:`DependencyError` with uv's last line, after the line that
    names what failed when that is another (:func:`uv_error`).

    ``find_links`` is a directory holding a wheel of the running rollbridge
    (:mod:`launcher.selfwheel`), searched besides the index for the rollout's ``rollbridge``.
    A path source that points at nothing (:func:`missing_path_sources`) is refused first."""
    missing = await trio.to_thread.run_sync(missing_path_sources, rollout_dir)
    if missing:
        name, written, target = missing[0]
        fix = (
            "remove that entry to use the running rollbridge's own wheel"
            if name == "rollbridge"
            else "fix or remove that entry"
        )
        raise DependencyError(
            f"rollouts/{rollout}/pyproject.toml takes {name} from the path {written!r} "
            f"({target}) in [tool.uv.sources], where there is no Python project: {fix}"
        )
    extra: list[str | Path] = []
    if find_links is not None:
        from launcher.selfwheel import installed_differs

        extra = ["--find-links", find_links]
        if installed_differs(find_links, rollout_python(rollout_dir, env).parent.parent):
            extra += ["--reinstall-package", "rollbridge"]
    async with trio.open_nursery() as nursery:
        child = await spawn_child(
            nursery,
            [uv, "sync", "--project", rollout_dir, *extra],
            cwd=rollout_dir,
            env=child_environment(env),
            sink=sink,
            name="uv",
        )
        try:
            rc = await child.process.wait()
        except BaseException:
            await child.stop(STOP_GRACE_S)
            raise
        assert child.output_done is not None
        with trio.move_on_after(0.5):
            await child.output_done.wait()
    if rc != 0:
        said = uv_error(child.tail, child.last_line)
        tail = f": {redact(said)}" if said else ""
        raise DependencyError(
            f"uv sync failed for rollouts/{rollout} with exit code {rc}{tail}\nLogs: {logs_hint}"
        )
