"""``eval export`` and ``eval rubric`` through the control API: each request runs
the CLI command with ``--json`` in the workspace, as a child in its own session, and answers
its JSON envelope, so the API's behaviour and errors are the CLI's (one implementation).

The child's output goes to files in ``.osmosis/daemon/tools/``, never a pipe left undrained.
Provider keys for a rubric's judge come the way a run's secrets do: the daemon's environment,
or ``secrets`` in the body, put into the child's environment only. A request that times out
(or whose client goes away) stops its child by process group.
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from launcher.daemon.apierror import ApiError, refuse_nul
from launcher.daemon.children import spawn_logged
from launcher.daemon.discovery import state_dir
from launcher.daemon.paths import output_path, read_path
from launcher.rubric.inputs import DEFAULT_REPORT_NAME
from launcher.rundir.atomic import ensure_dir

__all__ = ["TOOL_TIMEOUT_S", "export_args", "rubric_args", "run_tool"]

#: Seconds an export may take; a rubric gets ``RUBRIC_TIMEOUT_S`` (it calls a judge).
TOOL_TIMEOUT_S = 300.0
RUBRIC_TIMEOUT_S = 3600.0


def _field(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ApiError(400, "VALIDATION", f"{key} has the wrong type")
    refuse_nul(key, value)
    return value


def _known(body: Mapping[str, Any], keys: set[str]) -> None:
    unknown = sorted(set(body) - keys)
    if unknown:
        raise ApiError(400, "VALIDATION", f"unknown field(s): {', '.join(unknown)}")


def export_args(workspace: Path, name: str, body: Mapping[str, Any]) -> list[str]:
    """``eval export NAME [--format F] [-o PATH]`` from ``{"format", "output", "overwrite"}``:
    the output file is checked by :func:`launcher.daemon.paths.output_path` (inside
    ``workspace``, not under ``.osmosis/``, an existing file only with ``overwrite``)."""
    _known(body, {"format", "output", "overwrite"})
    args = ["export", name]
    fmt = _field(body, "format", str)
    if fmt is not None:
        if fmt not in ("jsonl", "parquet"):
            raise ApiError(400, "VALIDATION", "format must be jsonl or parquet")
        args += ["--format", fmt]
    overwrite = bool(_field(body, "overwrite", bool))
    output = _field(body, "output", str)
    if output == "-":
        raise ApiError(400, "VALIDATION", "output must be a file path")
    if output:
        args += ["-o", output_path(workspace, "output", output, overwrite=overwrite)]
    return args


_RUBRIC_FLAGS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "rubric": ("--rubric", str),
    "model": ("--model", str),
    "judges": ("--judges", str),
    "number": ("--number", int),
    "output": ("--output", str),
    "timeout": ("--timeout", (int, float)),
    "score_min": ("--score-min", (int, float)),
    "score_max": ("--score-max", (int, float)),
}


def rubric_args(workspace: Path, name: str, body: Mapping[str, Any]) -> list[str]:
    """``eval rubric --run NAME …`` from the body's fields (``secrets`` is taken apart). An
    ``@path`` rubric must be inside ``workspace`` and not under its ``.osmosis/``: a request
    must not make the daemon read (and send to a judge) a file elsewhere on the machine, nor
    its own token. The output is checked as an export's (``DIR/`` is a report inside DIR)."""
    _known(body, {*_RUBRIC_FLAGS, "secrets", "overwrite"})
    if not _field(body, "rubric", str):
        raise ApiError(400, "VALIDATION", "rubric (the text, or @path) is required")
    overwrite = bool(_field(body, "overwrite", bool))
    args = ["rubric", "--run", name]
    for key, (flag, kind) in _RUBRIC_FLAGS.items():
        value = _field(body, key, kind)
        if value is None:
            continue
        if key == "rubric" and value.startswith("@"):
            value = "@" + read_path(workspace, "rubric @path", value[1:])
        elif key == "output":
            value = output_path(
                workspace, key, value, overwrite=overwrite, directory_file=DEFAULT_REPORT_NAME
            )
        args += [flag, str(value)]
    return args


async def run_tool(
    workspace: Path,
    args: Sequence[str],
    *,
    secrets: Mapping[str, str] | None = None,
    timeout_s: float = TOOL_TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``rollbridge eval <args> --json`` in ``workspace``; its success envelope, or its
    error as an :class:`ApiError` (the CLI's code and one-line message)."""
    tools = state_dir(workspace) / "tools"
    ensure_dir(tools)
    stem = tools / _secrets.token_hex(8)
    out_path, err_path = stem.with_suffix(".stdout"), stem.with_suffix(".stderr")
    argv = [sys.executable, "-m", "launcher", "eval", *args, "--json"]
    process = await spawn_logged(
        argv, cwd=workspace, secrets=dict(secrets or {}), out=out_path, err=err_path
    )
    try:
        with trio.move_on_after(timeout_s):
            await process.wait()
        if process.returncode is None:
            raise ApiError(504, "TIMEOUT", f"eval {args[0]} took longer than {timeout_s:g} s")
        return _envelope(out_path, err_path, process.returncode, args[0])
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await process.wait()
        out_path.unlink(missing_ok=True)
        err_path.unlink(missing_ok=True)


def _envelope(out: Path, err: Path, code: int, command: str) -> dict[str, Any]:
    lines = [line for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        error = doc["error"]
        raise ApiError.from_cli(str(error.get("code") or "ERROR"), str(error.get("message")))
    if code != 0 or not isinstance(doc, dict):
        last = err.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        message = last[-1] if last else f"eval {command} exited with code {code}"
        raise ApiError(500, "ERROR", message)
    return doc
