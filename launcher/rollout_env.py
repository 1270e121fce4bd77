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
    """Locate the ``uv`` executable: ``$UV``, next to this interpreter's scripts, next to
    ``sys.executable``, where the ``uv`` package says it installed its binary (the user scheme's
    ``~/.local/bin`` after ``pip install --user``, a ``--prefix`` or ``--target``), then on
    ``PATH``. ``pip install rollbridge[cli]`` installs uv as a package, so one of these finds
    it wherever pip put rollbridge."""
    names = ("uv.exe", "uv") if os.name == "nt" else ("uv",)
    candidates: list[Path] = []
    explicit = os.environ.get("UV")
    if explicit:
        candidates.append(Path(explicit))
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.extend(Path(scripts) / n for n in names)
    candidates.extend(Path(sys.executable).parent / n for n in names)
    try:
        from uv import find_uv_bin

        candidates.append(Path(find_uv_bin()))
    except (ImportError, FileNotFoundError):
        pass
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
#: How uv labels the parts of an error: plain (uv's output to a pipe), older, or drawn as a
#: tree (to a terminal: ``×`` the error, ``╰─▶`` its causes).
_LABEL = re.compile(r"^(error|cause|caused by|hint|help):\s*", re.IGNORECASE)
_TREE = re.compile(r"^(×|[╰├]─*▶)\s*")


def _last_error(lines: Iterable[str]) -> list[tuple[str, str]]:
    """The parts of the last error uv printed, as ``(label, text)``: the error itself, its
    causes and hints, each part's wrapped lines joined; other lines (progress, a child
    process's own output that uv quotes) are not parts."""
    parts: list[tuple[str, str]] = []
    joining = False
    for line in lines:
        text = line.strip()
        if not text:
            continue
        label = _LABEL.match(text)
        tree = _TREE.match(text)
        if label or tree:
            kind = label.group(1).lower() if label else ("error" if text[0] == "×" else "cause")
            if kind == "error":
                parts = []  # an error of its own: only the last one counts
            parts.append((kind, text[(label or tree).end() :]))  # type: ignore[union-attr]
            joining = True
        elif joining and parts and line[:1].isspace():
            kind, said = parts[-1]
            parts[-1] = (kind, f"{said} {text}")  # a part wrapped over lines
        else:
            joining = False
    return parts


def uv_error(lines: Iterable[str], last_line: str) -> str:
    """What a failed ``uv sync`` said, in one line: the deepest cause of its last error
    (``operation timed out``), after the part that names what failed (``Failed to fetch:
    <url>``) when that is another; then uv's hint, which often says why (``the network was
    disabled``). Without an error uv labelled, its last line."""
    parts = _last_error(lines)
    causes = [text for kind, text in parts if kind not in ("hint", "help") and text]
    if not causes:
        return last_line
    said = causes[-1]
    named = next((m.group() for m in map(_WHAT_FAILED.search, causes) if m), None)
    if named is not None and named not in said:
        said = f"{named}: {said}"
    hint = next((text for kind, text in parts if kind in ("hint", "help") and text), None)
    if hint is not None:
        first = hint.split(". ")[0].rstrip(".")
        said = f"{said} (hint: {first})"
    return said


def _offered_python(rollout_dir: Path, env: Mapping[str, str]) -> Path | None:
    """This interpreter, for a rollout environment made for the first time when nothing else
    chooses one (no ``UV_PYTHON``, no ``.python-version``) and it meets the rollout's
    ``requires-python``: uv looks only on ``PATH`` and among its own downloads, and would
    otherwise download a Python (or fail offline) on a machine whose one suitable Python runs
    rollbridge from outside ``PATH``. An environment that exists keeps its interpreter."""
    if env.get("UV_PYTHON") or rollout_python(rollout_dir, env).exists():
        return None
    if any((d / ".python-version").is_file() for d in (rollout_dir, *rollout_dir.parents)):
        return None
    try:  # packaging comes with the cli extra (LiteLLM's), not with the base install
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
    except ImportError:
        return None
    try:
        with (rollout_dir / "pyproject.toml").open("rb") as f:
            wanted = tomllib.load(f).get("project", {}).get("requires-python", "")
        here = ".".join(map(str, sys.version_info[:3]))
        if not isinstance(wanted, str) or here not in SpecifierSet(wanted):
            return None
    except (OSError, tomllib.TOMLDecodeError, AttributeError, InvalidSpecifier):
        return None  # uv decides, as it would anyway
    return Path(sys.executable)


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
    no_wheel: str | None = None,
) -> None:
    """Run ``uv sync --project <rollout_dir>`` to completion (no timeout: the first sync may
    download a lot). Output goes to ``sink``. Cancellation stops uv's group (5 s grace).
    A non-zero exit raises :class:`DependencyError` with uv's last line, after the line that
    names what failed when that is another (:func:`uv_error`).

    ``find_links`` is a directory holding a wheel of the running rollbridge
    (:mod:`launcher.selfwheel`), searched besides the index for the rollout's ``rollbridge``;
    ``no_wheel`` says why there is none, for the error of a sync that then fails. A path source that points at nothing (:func:`missing_path_sources`) is refused first."""
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
    python = await trio.to_thread.run_sync(_offered_python, rollout_dir, env)
    if python is not None:
        extra += ["--python", python]
    if find_links is not None:
        from launcher.selfwheel import installed_differs

        extra += ["--find-links", find_links]
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
        if no_wheel is not None:
            tail += f" (no wheel of the running rollbridge to offer it: {redact(no_wheel)})"
        raise DependencyError(
            f"uv sync failed for rollouts/{rollout} with exit code {rc}{tail}\nLogs: {logs_hint}"
        )
