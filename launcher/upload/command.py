"""``rollbridge eval upload RUN [--replace]`` and the upload step of ``eval run --upload``
(docs/upload.md).

Both take the run's lock (the one ``eval run`` holds), re-redact ``logs.txt`` with the current
environment's known keys, validate the directory and hash its files
(:mod:`launcher.upload.plan`), then publish through a :class:`~launcher.upload.transport.Transport`
(the 0.3.8 import protocol). The platform token is resolved once, added to the output's
redactor, and sent only in the platform requests' ``Authorization`` header.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import click
import httpx
import trio

from launcher.cli_ui import ambient_redactor, command_ui
from launcher.errors import CLIError, ConflictError, NotFoundError
from launcher.prepare import EvalOptions
from launcher.redact import Redactor
from launcher.reporting.resolve import find_workspace_root
from launcher.rundir.discard import CompleteRunError
from launcher.rundir.lock import RunLock, lock_path
from launcher.ui import UI, OutputMode
from launcher.upload.files import UploadError, scrub_logs_file
from launcher.upload.identity import PlatformIdentity, resolve_identity
from launcher.upload.import038 import Import038
from launcher.upload.plan import UploadPlan, build_plan
from launcher.upload.progress import UploadProgress, format_bytes
from launcher.upload.transport import PlatformError, Published, Transport, printable
from launcher.workspace import resolve_workspace

__all__ = [
    "AfterRunUpload",
    "UploadingUI",
    "check_run_dir",
    "eval_upload",
    "platform_identity",
    "resolve_upload_dir",
    "retry_command",
    "run_workspace",
    "upload_step",
]

COMMAND = "rollbridge eval upload"
#: The 409 of a start whose manifest digest is not the imported run's (``--replace`` is no help).
MANIFEST_MISMATCH = "EVAL_IMPORT_MANIFEST_MISMATCH"
_RUN_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _valid_run_name(name: str) -> bool:
    return bool(name) and name[0].isalnum() and set(name) <= _RUN_NAME_CHARS and name != ".locks"


def resolve_upload_dir(arg: str, *, cwd: Path) -> Path:
    """The run directory ``arg`` names (spec C.1): a path with a directory part, or an
    existing directory, as given; else a run name under ``<workspace>/.osmosis/evals``."""
    requested = Path(arg).expanduser()
    direct = Path(os.path.abspath(cwd / requested))
    if requested.is_absolute() or len(requested.parts) != 1 or direct.is_dir():
        return direct
    if not _valid_run_name(arg):
        return direct
    workspace = find_workspace_root(cwd)
    if workspace is None:
        raise NotFoundError(
            f"'{arg}' is not a directory and no workspace was found at or above {cwd}; "
            "pass the run directory, or run this from the workspace"
        )
    return workspace / ".osmosis" / "evals" / arg


def run_workspace(run_dir: Path) -> Path:
    """Where the run's git work tree is looked for: ``<workspace>`` of
    ``<workspace>/.osmosis/evals/<name>``, else the run directory itself."""
    if run_dir.parent.name == "evals" and run_dir.parent.parent.name == ".osmosis":
        return run_dir.parent.parent.parent
    return run_dir


def check_run_dir(run_dir: Path) -> None:
    """``run_dir`` must look like a run (a directory with a ``manifest.json``) before anything
    touches it: the lock file, the re-redaction of ``logs.txt``."""
    if not run_dir.is_dir():
        raise NotFoundError(f"no run directory at {run_dir}")
    if not (run_dir / "manifest.json").is_file():
        raise NotFoundError(f"{run_dir} is not a run directory (no manifest.json)")


def platform_identity(ui: UI, workspace_name: str | None, workspace: Path) -> PlatformIdentity:
    """Resolve the platform identity (the git scope from ``workspace``'s work tree) and teach
    ``ui``'s redactor its token."""
    identity = resolve_identity(
        os.environ, cwd=workspace, home=Path.home(), workspace_name=workspace_name
    )
    if isinstance(ui, UploadingUI):
        ui.secret = identity.token
    redactor = ambient_redactor()
    redactor.add(identity.token)
    ui.set_redactor(redactor)
    return identity


def upload_command_line(arg: str, *, replace: bool, workspace_name: str | None = None) -> str:
    """``rollbridge eval upload <arg>[ --replace][ --workspace NAME]``, quoted for a shell."""
    line = f"{COMMAND} {shlex.quote(arg)}{' --replace' if replace else ''}"
    if workspace_name is not None:
        line += f" --workspace {shlex.quote(workspace_name)}"
    return line


def retry_command(run_dir: Path, *, replace: bool, workspace_name: str | None, cwd: Path) -> str:
    """The command that publishes ``run_dir`` when typed in ``cwd``: by its name when the name
    resolves to it there, else by its path."""
    arg = str(run_dir)
    try:
        if resolve_upload_dir(run_dir.name, cwd=cwd) == Path(os.path.abspath(run_dir)):
            arg = run_dir.name
    except NotFoundError:
        pass
    return upload_command_line(arg, replace=replace, workspace_name=workspace_name)


def _lock(run_dir: Path) -> RunLock:
    try:
        return RunLock.acquire(run_dir.parent, run_dir.name)
    except ConflictError:
        raise ConflictError(
            f"another `rollbridge eval run` or `{COMMAND}` of this run holds "
            f"{lock_path(run_dir.parent, run_dir.name)}; wait for it to finish, then retry."
        ) from None


async def publish_run(
    run_dir: Path,
    identity: PlatformIdentity,
    *,
    replace: bool,
    progress: UploadProgress,
    config_path: str | None = None,
) -> tuple[UploadPlan, Published]:
    """Scrub, plan and publish ``run_dir``; the caller holds the run's lock."""
    await trio.to_thread.run_sync(
        lambda: scrub_logs_file(run_dir / "logs.txt", os.environ, (identity.token,))
    )
    # Hashing only reads: a Ctrl-C need not wait for the last file's hash.
    plan = await trio.to_thread.run_sync(
        partial(build_plan, run_dir, config_path=config_path), abandon_on_cancel=True
    )
    async with httpx.AsyncClient(follow_redirects=False) as http:
        # The one transport today; the 0.3.10 archive protocol would be chosen here.
        transport: Transport = Import038(
            identity, http, env_token=os.environ.get("OSMOSIS_TOKEN") == identity.token
        )
        published = await transport.publish(plan, replace=replace, progress=progress)
    return plan, published


def _resource(plan: UploadPlan, published: Published, identity: PlatformIdentity) -> dict[str, Any]:
    return {
        "session_id": published.session_id,
        "local_run_id": plan.local_run_id,
        "local_run_path": str(plan.run_dir),
        "eval_run_id": published.eval_run_id,
        "eval_run_name": published.eval_run_name,
        "status": published.status,
        "expected_files": published.expected_files,
        "uploaded_files": published.uploaded_files,
        "platform_url": published.platform_url,
        "sent_files": published.sent_files,
        "sent_bytes": published.sent_bytes,
        **identity.context(),
    }


async def _upload(
    run_dir: Path, arg: str, replace: bool, identity: PlatformIdentity, ui: UI
) -> dict[str, Any]:
    with _lock(run_dir):
        try:
            plan, published = await publish_run(
                run_dir, identity, replace=replace, progress=UploadProgress(ui)
            )
        except PlatformError as exc:
            if exc.status == 409 and exc.code == MANIFEST_MISMATCH:
                raise CLIError(
                    f"{exc.message} The run's manifest.json differs from the one imported "
                    "for this local run; --replace cannot change it.",
                    code=exc.code,
                    details=exc.details,
                ) from None
            if exc.status == 409 and not replace:
                again = upload_command_line(
                    arg, replace=True, workspace_name=identity.workspace_name
                )
                raise CLIError(
                    f"{exc.message} Re-run it with --retry-failed, then republish with: {again}",
                    code=exc.code,
                    details=exc.details,
                ) from None
            if exc.status is None or exc.status == 429 or exc.status >= 500:
                # No answer, or one that says later: what was sent counts, so the same command
                # goes on from there.
                again = upload_command_line(
                    arg, replace=replace, workspace_name=identity.workspace_name
                )
                raise PlatformError(
                    f"{exc.message} Run `{again}` again to resume the upload.",
                    status=exc.status,
                    code=exc.code,
                    details=exc.details,
                ) from None
            raise
        except (UploadError, CLIError):
            raise
        except (OSError, RuntimeError, ValueError) as exc:
            raise CLIError(f"Local evaluation upload failed: {exc}", code="UPLOAD") from None
    return _resource(plan, published, identity)


@click.command("upload")
@click.argument("run", metavar="RUN")
@click.option(
    "--replace",
    is_flag=True,
    help="Replace the results this run already imported, for a run re-run with --retry-failed.",
)
@click.option(
    "--workspace",
    "platform_workspace",
    default=None,
    help="Platform workspace to publish to (default: the one of the git origin).",
)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON result envelope.")
@click.option("--plain", is_flag=True, help="Plain text output: result and next steps only.")
@click.pass_context
def eval_upload(
    ctx: click.Context,
    /,
    run: str,
    replace: bool,
    platform_workspace: str | None,
    json_output: bool,
    plain: bool,
) -> None:
    """Publish a finished local run (RUN: a run name or a run directory) to the platform.

    Interrupted uploads resume: run the same command again.
    """
    ui = command_ui(ctx.obj, json_output, plain)
    if not run.strip():
        raise click.UsageError("RUN must be a run name or a run directory, not empty")
    run_dir = resolve_upload_dir(run, cwd=Path.cwd())
    check_run_dir(run_dir)
    identity = platform_identity(ui, platform_workspace, run_workspace(run_dir))
    try:
        resource = trio.run(_upload, run_dir, run, replace, identity, ui)
    except KeyboardInterrupt:
        again = upload_command_line(run, replace=replace, workspace_name=platform_workspace)
        ui.warning(f"Upload interrupted; run `{again}` to resume.", "INTERRUPTED")
        raise
    message = f"Uploaded local evaluation: {printable(resource['eval_run_name'])}"
    if ui.mode == "json":
        ui.envelope("eval.upload", message, resource)
        return
    sent = f"{resource['sent_files']} files, {format_bytes(resource['sent_bytes'])} sent"
    ui.result(
        status="success",
        message=f"{message} ({sent})",
        next_steps=[f"View: {printable(resource['platform_url'])}"],
    )


@dataclass
class AfterRunUpload:
    """The upload step of ``eval run --upload``: after a complete, terminal run and under the
    run's lock, publish it (``replace`` follows ``--retry-failed``); an incomplete or cancelled
    run is not uploaded and the final message says why. Any failure of the upload keeps the
    run and says how to retry; a Ctrl-C stops it and the final message says how to resume. It
    amends the run's result through :meth:`amend`."""

    identity: PlatformIdentity
    replace: bool
    ui: UI
    outcome: dict[str, Any] | None = None
    skipped: bool = False
    interrupted: str | None = None  # the command that resumes an interrupted upload

    async def __call__(self, run_dir: Path, complete: bool, config_path: str | None) -> None:
        """Upload ``run_dir`` when ``complete``; otherwise remember that it was skipped."""
        if not complete:
            self.skipped = True
            return
        self.ui.close_progress()
        retry = retry_command(
            run_dir,
            replace=self.replace,
            workspace_name=self.identity.workspace_name,
            cwd=Path.cwd(),
        )
        where = f"Local evaluation results are complete at {run_dir}, but"
        try:
            plan, published = await publish_run(
                run_dir,
                self.identity,
                replace=self.replace,
                progress=UploadProgress(self.ui),
                config_path=config_path,
            )
        except trio.Cancelled:
            self.interrupted = retry
            raise
        except UploadError as exc:
            raise CompleteRunError(
                f"{where} cannot be uploaded: {exc.message}\nRetry with: {retry}", code=exc.code
            ) from None
        except PlatformError as exc:
            raise CompleteRunError(
                f"{where} the platform upload failed: {exc.message}\nRetry with: {retry}",
                code=exc.code,
                details=exc.details,
            ) from None
        except Exception as exc:  # whatever stopped it, the results stay and a retry may do
            detail = exc.message if isinstance(exc, CLIError) else f"{type(exc).__name__}: {exc}"
            raise CompleteRunError(
                f"{where} the local evaluation upload failed: {detail}\nRetry with: {retry}",
                code="UPLOAD",
            ) from None
        self.outcome = _resource(plan, published, self.identity)

    def amend(
        self, message: str, next_steps: list[str], resource: dict[str, Any]
    ) -> tuple[str, list[str], dict[str, Any]]:
        """The run's result with the upload's outcome: the platform run, or why it was skipped."""
        if self.skipped:
            return (
                message + " Upload skipped because the local evaluation is incomplete.",
                next_steps,
                resource,
            )
        if self.interrupted is not None:
            note = f" Upload interrupted; run `{self.interrupted}` to resume."
            return message + note, next_steps, {**resource, "upload": {"status": "interrupted"}}
        if self.outcome is None:
            return message, next_steps, resource
        upload = {
            k: self.outcome[k]
            for k in (
                "session_id",
                "eval_run_id",
                "eval_run_name",
                "status",
                "expected_files",
                "uploaded_files",
            )
        }
        resource = {**resource, "upload": upload, "platform_url": self.outcome["platform_url"]}
        view = f"View: {printable(self.outcome['platform_url'])}"
        return message, [*next_steps, view], resource


def upload_step(
    mode: OutputMode, options: EvalOptions, workspace_name: str | None
) -> tuple[UploadingUI, AfterRunUpload]:
    """The UI and the after-run step of ``eval run --upload``; the login is resolved now, so a
    missing one fails before any work runs."""
    ui = UploadingUI(mode, verbose=options.verbose, redact=ambient_redactor())
    workspace = resolve_workspace(Path(options.config), Path.cwd()).root
    step = AfterRunUpload(
        platform_identity(ui, workspace_name, workspace), options.retry_failed, ui
    )
    ui.upload = step
    return ui, step


class UploadingUI(UI):
    """The UI of ``eval run --upload``: its final result carries the upload's outcome."""

    upload: AfterRunUpload | None = None
    secret: str | None = None

    def set_redactor(self, redact: Callable[[str], str]) -> None:
        """Use ``redact`` (the run's redactor), which learns the platform token too."""
        if isinstance(redact, Redactor) and self.secret is not None:
            redact.add(self.secret)
        super().set_redactor(redact)

    def result(
        self,
        *,
        status: Literal["success", "partial"],
        message: str,
        next_steps: Sequence[str],
        resource: Mapping[str, Any] | None = None,
    ) -> None:
        """The run's result, amended by the upload step (:meth:`AfterRunUpload.amend`)."""
        steps, body = list(next_steps), dict(resource or {})
        if self.upload is not None:
            message, steps, body = self.upload.amend(message, steps, body)
            if self.upload.interrupted is not None:
                status = "partial"
        super().result(status=status, message=message, next_steps=steps, resource=body)
