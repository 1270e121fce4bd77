"""The runs a daemon serves: every run directory under ``.osmosis/evals/`` merged with the live
children it started or adopted after a restart.

Starting a run validates it the way the CLI does (the same ``prepare`` step, in a thread) and
then spawns the child; the answer waits until the child has either opened its run directory or
failed, so errors that only the child can see (``Changed: …``, a lock held elsewhere) still
come back as the CLI's one-line message.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from launcher.daemon.apierror import ApiError, refuse_nul
from launcher.daemon.children import RunChild, envelope, read_records, spawn_run
from launcher.daemon.discovery import state_dir
from launcher.daemon.paths import inside_workspace, refuse_osmosis
from launcher.daemon.status import RunView, run_view
from launcher.errors import CLIError, ValidationError
from launcher.rundir.journal import replay_tolerant
from launcher.rundir.lock import run_is_live
from launcher.rundir.manifest import is_archive_name, is_run_dir
from launcher.rundir.names import generate_run_name, validate_run_name
from rollout_server.net.secrets import is_secret_env_name

__all__ = [
    "ApiError",
    "Registry",
    "StartRequest",
    "check_secrets",
    "inside_workspace",
    "parse_start",
    "refuse_nul",
]

#: How long ``POST /v1/runs`` waits for the child to open its run directory or fail.
START_WAIT_S = 30.0
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Names of variables that say where something is, or which file to read: never taken as a
#: request's secret, even when their name says TOKEN or KEY (``OSMOSIS_TOKEN_PLATFORM_URL``).
_PLACE_SUFFIXES = ("_URL", "_URI", "_BASE", "_ENDPOINT", "_HOST", "_PATH", "_FILE", "_DIR")


def check_secrets(secrets: Any) -> dict[str, str]:
    """A request's ``secrets``, checked: environment variable names that hold a credential
    (``KEY``, ``TOKEN``, ``SECRET``, ``PASSWORD`` in the name, or a known provider key) mapped
    to strings. Anything else is a 400: a variable such as ``OPENAI_BASE_URL``,
    ``HTTPS_PROXY`` or ``UV_INDEX_URL`` set by a request would send the daemon's own keys, or
    the run's code, where the request says; those belong in the eval config or the daemon's
    environment."""
    if not isinstance(secrets, dict) or not all(
        isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) for k, v in secrets.items()
    ):
        raise ApiError(400, "VALIDATION", "secrets must map environment variable names to strings")
    for key, value in secrets.items():
        refuse_nul(f"secrets.{key}", value)
        if not is_secret_env_name(key) or key.endswith(_PLACE_SUFFIXES):
            raise ApiError(
                400,
                "VALIDATION",
                f"secrets.{key} is not a credential's name (one with KEY, TOKEN, SECRET or "
                "PASSWORD in it); set other variables in the eval config or the daemon's "
                "environment",
            )
    return dict(secrets)


#: ``POST /v1/runs`` fields that become ``eval run`` flags, with their JSON types.
_FLAG_TYPES: dict[str, type | tuple[type, ...]] = {
    "rows": str,
    "limit": int,
    "fresh": bool,
    "retry_failed": bool,
    "max_in_flight": int,
    "tunnel": str,
    "advertise_url": str,
    "listener_port": int,
    "secrets_file": str,
    "shard": str,
    "ray": str,
    "ray_min_replicas": int,
}


@dataclass
class StartRequest:
    """A validated ``POST /v1/runs`` body."""

    config: str
    name: str | None
    flags: dict[str, Any]
    secrets: dict[str, str]


def parse_start(body: Any) -> StartRequest:
    """Check the body's shape (not its meaning: that is the CLI's ``prepare``)."""
    if not isinstance(body, dict):
        raise ApiError(400, "VALIDATION", "the request body must be a JSON object")
    config = body.get("config")
    if not isinstance(config, str) or not config:
        raise ApiError(400, "VALIDATION", "config (a path to an eval config) is required")
    refuse_nul("config", config)
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise ApiError(400, "VALIDATION", "name must be a string")
    refuse_nul("name", name)
    known = {"config", "name", "secrets", *_FLAG_TYPES}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, "VALIDATION", f"unknown field(s): {', '.join(unknown)}")
    flags: dict[str, Any] = {}
    for key, kind in _FLAG_TYPES.items():
        value = body.get(key)
        if value is None:
            continue
        if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
            raise ApiError(
                400, "VALIDATION", f"{key} must be of type {getattr(kind, '__name__', kind)}"
            )
        refuse_nul(key, value)
        flags[key] = value
    secrets = check_secrets(body.get("secrets") or {})
    return StartRequest(config=config, name=name, flags=flags, secrets=secrets)


def _prepare_check(workspace: Path, request: StartRequest, name: str | None) -> dict[str, Any]:
    """The CLI's own validation of the flags, config, dataset and rows (raises CLIError);
    what a run of it would do when it passes (``POST /v1/configs/validate``)."""
    from launcher.prepare import EvalOptions, prepare
    from launcher.rundir.manifest import MANIFEST_NAME, build_inputs, resumable
    from launcher.ui import UI

    spec = request.flags.get("secrets_file")
    if isinstance(spec, str) and spec != "-":
        # The child would read it on the request's behalf: never one of the daemon's files.
        refuse_osmosis(workspace, "secrets_file", spec)
    flags = {k: v for k, v in request.flags.items() if k != "secrets_file"}
    options = EvalOptions(config=request.config, name=name, yes=True, **flags)
    ui = UI("json", stdout=io.StringIO(), stderr=io.StringIO(), stdin=io.StringIO())
    prepared = prepare(options, ui, cwd=workspace)
    if prepared.workspace.root.resolve() != workspace.resolve():
        raise ValidationError(
            f"{request.config} belongs to the workspace {prepared.workspace.root}, "
            f"not to this daemon's {workspace}"
        )
    names = list(prepared.config.secrets_required)
    if names and request.flags.get("secrets_file") != "-":
        # As the run will resolve them (the secrets file, then its environment: the daemon's
        # plus the request's `secrets`), so that a missing one is this request's error.
        from launcher.process import child_environment
        from launcher.secrets import read_secrets_file, resolve_secrets

        files = read_secrets_file(spec, cwd=workspace) if isinstance(spec, str) else None
        environ = child_environment(os.environ, request.secrets)
        resolve_secrets(names, file_values=files, environ=environ)
    run_dir = prepared.output_root / name if name else None
    if run_dir is not None and not options.fresh and (run_dir / MANIFEST_NAME).is_file():
        # An existing run resumes only with the inputs it was made with: the run's own gate
        # would refuse the start, so validate says so now.
        from launcher.digest import source_digest

        digest = source_digest(prepared.paths.rollout_dir, prepared.output_root)
        inputs = prepared.with_shard(
            build_inputs(prepared.config, prepared.spec, prepared.selection, digest)
        )
        resumable(run_dir, name or "", inputs)
    return {
        "valid": True,
        "config": request.config,
        "model": prepared.config.experiment.model_path,
        "rollout": prepared.config.experiment.rollout,
        "dataset": prepared.dataset.name,
        "rows": len(prepared.selection.rows),
        "n": prepared.spec.n,
        "work_items": prepared.meta.total_work_items,
        "secrets_required": list(prepared.config.secrets_required),
    }


def _size(path: Path) -> int:
    """``path``'s size, 0 when missing (one ``stat``: cheap enough for the event loop)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class Registry:
    """Runs on disk plus live children; one per daemon."""

    def __init__(self, workspace: Path, nursery: trio.Nursery) -> None:
        self.workspace = workspace
        self.output_root = workspace / ".osmosis" / "evals"
        self.runs_dir = state_dir(workspace) / "runs"
        self._nursery = nursery
        self._children: dict[str, RunChild] = {}
        self._starting: set[str] = set()

    # -- children ------------------------------------------------------------------------

    def adopt(self) -> list[str]:
        """Find the live children a previous daemon started (pid + start token)."""
        adopted = []
        for name, record in read_records(self.runs_dir).items():
            if record.returncode is not None:
                continue
            child = RunChild(record, self.runs_dir, None)
            if child.alive:
                self._watch(child)
                adopted.append(name)
        return adopted

    def _watch(self, child: RunChild) -> None:
        self._children[child.record.name] = child
        self._nursery.start_soon(child.watch)

    def child(self, name: str) -> RunChild | None:
        """The child of run ``name`` if the daemon knows one (live or just ended)."""
        return self._children.get(name)

    def live(self, name: str) -> bool:
        """Whether run ``name`` has a live child."""
        child = self._children.get(name)
        return child is not None and child.alive

    def running(self, name: str) -> bool:
        """Whether run ``name`` is worked on now: by a live child of this daemon, or by a
        process that holds its run lock (a supervisor started in a terminal)."""
        return self.live(name) or run_is_live(self.output_root / name)

    def active(self) -> list[str]:
        """Names of runs with a live child."""
        return sorted(name for name in self._children if self.live(name))

    # -- start ---------------------------------------------------------------------------

    async def start(self, request: StartRequest) -> dict[str, Any]:
        """Validate, spawn and wait for the child to open its run (or fail)."""
        try:
            # An empty name is refused as the CLI refuses it; only an absent one is generated.
            name = validate_run_name(request.name) if request.name is not None else None
            name = name or generate_run_name(self.output_root)
        except CLIError as exc:
            raise ApiError.from_cli(exc.code, exc.message) from None
        if self.live(name) or name in self._starting:
            raise ApiError(409, "CONFLICT", f"run {name} is already running")
        self._starting.add(name)
        try:
            try:
                await trio.to_thread.run_sync(_prepare_check, self.workspace, request, name)
            except CLIError as exc:
                raise ApiError.from_cli(exc.code, exc.message) from None
            run_dir = self.output_root / name
            logs = run_dir / "logs.txt"
            # A corrupt journal is the child's to refuse, in its own words.
            done = len(replay_tolerant(run_dir / "events.jsonl")[0]) if run_dir.is_dir() else 0
            child = await spawn_run(
                workspace=self.workspace,
                runs_dir=self.runs_dir,
                logs_path=logs,
                config=request.config,
                name=name,
                flags=request.flags,
                secrets=request.secrets,
                done_at_start=done,
            )
            self._watch(child)
            await self._wait_opened(child, logs)
            return {"name": name, "run_dir": str(run_dir)}
        finally:
            self._starting.discard(name)

    async def _wait_opened(self, child: RunChild, logs: Path) -> None:
        """Until ``logs.txt`` grows (the child passed the manifest gate), or the child exits:
        then its error envelope becomes this request's error."""
        with trio.move_on_after(START_WAIT_S):
            while not child.exited.is_set():
                if _size(logs) > child.record.log_offset:
                    return
                await trio.sleep(0.05)
        if child.exited.is_set():
            doc = envelope(self.runs_dir, child.record.name) or {}
            error = doc.get("error")
            if isinstance(error, dict) and child.record.returncode not in (0, None):
                raise ApiError.from_cli(str(error.get("code")), str(error.get("message")))

    async def validate(self, request: StartRequest) -> dict[str, Any]:
        """The checks a start makes before it spawns anything, without starting."""
        try:
            name = validate_run_name(request.name) if request.name is not None else None
            return await trio.to_thread.run_sync(_prepare_check, self.workspace, request, name)
        except CLIError as exc:
            raise ApiError.from_cli(exc.code, exc.message) from None

    # -- views ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every run directory's name (archives excluded) and every live child's."""
        found = set(self._children)
        if self.output_root.is_dir():
            for path in self.output_root.iterdir():
                if (
                    path.is_dir()
                    and not path.name.startswith(".")
                    and not is_archive_name(path.name)
                    and is_run_dir(path)
                ):
                    found.add(path.name)
        return sorted(found)

    def view(self, name: str) -> RunView:
        """The merged view of run ``name``; ApiError 404 when nothing is known of it."""
        try:
            validate_run_name(name)
        except CLIError:
            raise ApiError(404, "NOT_FOUND", f"no run named {name!r}") from None
        run_dir = self.output_root / name
        child = self._children.get(name)
        records = {} if child is not None else read_records(self.runs_dir)
        record = child.record if child is not None else records.get(name)
        if not run_dir.is_dir() and record is None:
            raise ApiError(404, "NOT_FOUND", f"no run named {name!r}")
        if record is None and not is_run_dir(run_dir):
            # An empty directory, or one of the user's own: not listed, and no run to show.
            raise ApiError(404, "NOT_FOUND", f"{name!r} is not a run directory")
        alive = child is not None and child.alive
        return run_view(
            run_dir,
            record=record,
            alive=alive,
            child_envelope=envelope(self.runs_dir, name)
            if record is not None and not alive
            else None,
        )

    # -- cancel --------------------------------------------------------------------------

    def cancel(self, name: str, stage: int) -> dict[str, Any]:
        """Stage 1 = the first Ctrl-C, stage 2 = the second (sent twice if none came yet)."""
        child = self._children.get(name)
        if child is None or not child.alive:
            self.view(name)  # 404 for an unknown name
            if run_is_live(self.output_root / name):
                raise ApiError(
                    409,
                    "CONFLICT",
                    f"run {name} is run by a process this daemon did not start (it holds the "
                    "run's lock): stop it where it runs (Ctrl-C in its terminal)",
                )
            raise ApiError(409, "CONFLICT", f"run {name} is not running")
        sent = child.record.cancel_stage
        while sent < stage:
            if not child.send_interrupt():
                break
            sent += 1
        child.record.cancel_stage = max(child.record.cancel_stage, sent)
        child.record.save(self.runs_dir)
        return {"name": name, "cancel_stage": child.record.cancel_stage}

    async def cancel_all(self, grace_s: float) -> None:
        """Stage 1 to every live run, stage 2 after half of ``grace_s``, then wait the rest."""
        names = self.active()
        for name in names:
            self.cancel(name, 1)
        with trio.move_on_after(grace_s / 2):
            for name in names:
                await self._children[name].exited.wait()
        for name in self.active():
            self.cancel(name, 2)
        with trio.move_on_after(grace_s / 2):
            for name in names:
                await self._children[name].exited.wait()

    def summaries(self, state: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/runs``: one document per run, optionally filtered by state."""
        out = []
        for name in self.names():
            try:
                doc = self.view(name).doc
            except ApiError:
                continue
            if state is None or doc["state"] == state:
                out.append(doc)
        return out
