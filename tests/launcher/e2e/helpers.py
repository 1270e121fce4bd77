"""Helpers for the end-to-end tests: copy the example workspace, build the CLI's environment, run
the real ``rollbridge`` CLI as a subprocess (to completion or live, so a test can signal it), and
read what a run left in its run directory.

The fixtures built on these live in ``conftest.py``; test modules import from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import trio

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "workspace"
UV = Path(sys.executable).parent / "uv"


def make_workspace(dest: Path) -> Path:
    """Copy the example workspace to ``dest`` with an absolute path source to this repo."""
    shutil.copytree(
        EXAMPLE,
        dest,
        ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__"),
    )
    pyproject = dest / "rollouts" / "echo" / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace('path = "../../../.."', f'path = "{REPO}"'))
    return dest


def base_env(**extra: str) -> dict[str, str]:
    """A clean environment for the CLI: no provider keys, no inherited virtualenv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and k not in ("VIRTUAL_ENV", "OPENAI_BASE_URL")
    }
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def synced_venv(project: Path, venv: Path) -> Path:
    """``uv sync`` of the rollout ``project`` into ``venv`` (returned): one environment a
    session's tests share instead of each syncing its own."""
    subprocess.run(
        [str(UV), "sync", "--project", str(project)],
        env=base_env(UV_PROJECT_ENVIRONMENT=str(venv)),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return venv


@dataclass
class CLIResult:
    """A finished CLI run."""

    returncode: int
    stdout: str
    stderr: str

    def envelope(self) -> dict[str, Any]:
        """The one JSON document on stdout (``--json``)."""
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, self.stdout
        document: dict[str, Any] = json.loads(lines[0])
        return document


def cli_argv(*args: str) -> list[str]:
    """``python -m launcher <args>`` with this interpreter."""
    return [sys.executable, "-m", "launcher", *args]


async def run_cli(
    args: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 120.0
) -> CLIResult:
    """Run the CLI to completion (under ``fail_after``) and capture its output."""
    with trio.fail_after(timeout):
        proc = await trio.run_process(
            cli_argv(*args),
            cwd=str(cwd),
            env=dict(env),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    return CLIResult(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


class LiveCLI:
    """A CLI subprocess we can signal while it runs."""

    def __init__(self, process: trio.Process, out: Path, err: Path) -> None:
        self.process = process
        self._out = out
        self._err = err

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the CLI process."""
        self.process.send_signal(sig)

    def kill9(self) -> None:
        """``kill -9`` the CLI process (it gets no chance to clean up)."""
        self.process.send_signal(signal.SIGKILL)

    async def wait(self, timeout: float = 120.0) -> CLIResult:
        """Wait for the CLI to exit (under ``fail_after``) and read what it wrote."""
        with trio.fail_after(timeout):
            rc = await self.process.wait()
        return CLIResult(rc, self._out.read_text(), self._err.read_text())


async def start_cli(
    args: Sequence[str], *, cwd: Path, env: Mapping[str, str], logdir: Path
) -> LiveCLI:
    """Start the CLI with output going to files (so a test can poll files meanwhile)."""
    out, err, fds = _output_files(logdir)
    try:
        process = await trio.lowlevel.open_process(
            cli_argv(*args),
            cwd=str(cwd),
            env=dict(env),
            stdout=fds[0],
            stderr=fds[1],
            stdin=subprocess.DEVNULL,
        )
    finally:
        for fd in fds:
            os.close(fd)
    return LiveCLI(process, out, err)


def _output_files(logdir: Path) -> tuple[Path, Path, tuple[int, int]]:
    logdir.mkdir(parents=True, exist_ok=True)
    out, err = logdir / "stdout.txt", logdir / "stderr.txt"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    return out, err, (os.open(out, flags, 0o600), os.open(err, flags, 0o600))


async def wait_for(predicate: Any, timeout: float = 60.0, interval: float = 0.05) -> None:
    """Poll ``predicate()`` until true (under ``fail_after``)."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(interval)


def run_dir(workspace: Path, name: str) -> Path:
    """``<workspace>/.osmosis/evals/<name>``."""
    return workspace / ".osmosis" / "evals" / name


def count_log(run: Path, needle: str) -> int:
    """How many logs.txt lines contain ``needle``."""
    try:
        return sum(1 for line in (run / "logs.txt").read_text().splitlines() if needle in line)
    except FileNotFoundError:
        return 0


def journal(run: Path) -> list[dict[str, Any]]:
    """The committed journal records."""
    try:
        text = (run / "events.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def metrics(run: Path) -> dict[str, Any]:
    """``metrics.json``."""
    document: dict[str, Any] = json.loads((run / "metrics.json").read_text())
    return document


def server_record(run: Path) -> dict[str, Any] | None:
    """``server.json`` when present."""
    try:
        record: dict[str, Any] = json.loads((run / "server.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record


def processes_in_group(pgid: int) -> list[psutil.Process]:
    """Live processes of process group ``pgid`` (zombies excluded)."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def write_config(workspace: Path, name: str, body: str) -> Path:
    """Add ``configs/eval/<name>.toml`` to the workspace."""
    path = workspace / "configs" / "eval" / f"{name}.toml"
    path.write_text(body)
    return path


def fake_model_config(
    *, batch_size: int = 4, secrets: Sequence[str] = (), extra_env: Mapping[str, str] = {}
) -> str:
    """An eval config for the echo rollout on an ``openai/...`` model (the fake upstream)."""
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in extra_env.items())
    required = ", ".join(f'"{s}"' for s in secrets)
    return (
        "[experiment]\n"
        'rollout = "echo"\nentrypoint = "main.py"\nmodel_path = "openai/fake-model"\n'
        'dataset = "echo.jsonl"\n\n'
        f"[evaluation]\nbatch_size = {batch_size}\n"
        "agent_workflow_timeout_s = 60\ngrader_timeout_s = 30\n\n"
        + (f"[env]\n{env_lines}\n" if env_lines else "")
        + f"[secrets]\nrequired = [{required}]\n"
    )


def bridge_child_pid(cli_pid: int) -> int | None:
    """The pid of the CLI's bridge process (``python -m bridge.child``), if it runs."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(cli_pid).children():
            with contextlib.suppress(psutil.Error):
                if "bridge.child" in child.cmdline():
                    return child.pid
    return None


def process_gone(pid: int) -> bool:
    """Whether ``pid`` is no longer a live process (a zombie nobody reaps counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
