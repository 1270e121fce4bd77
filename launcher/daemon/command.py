"""``rollbridge daemon [--workspace DIR] [--http] [--host H] [--port N] [--allow-origin O]``:
run the control API in the foreground (an IDE or a service manager starts it). One per
workspace: a second start prints ``already running (pid …, socket …)`` and exits 0."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import click
import trio

from launcher.errors import NotFoundError, ValidationError

__all__ = ["daemon_main"]


#: ``scheme://host[:port]`` or ``scheme://*`` (every origin of the scheme).
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\*|[^/\s*]+)")


def daemon_main(
    workspace: str | None,
    http: bool,
    host: str,
    port: int,
    json_output: bool,
    allow_origins: tuple[str, ...] = (),
) -> int:
    """Run the daemon; returns the exit code."""
    from launcher.daemon.discovery import DaemonLock
    from launcher.daemon.service import DaemonOptions, already_running, run_daemon

    for origin in allow_origins:
        if not _ORIGIN.fullmatch(origin):
            raise ValidationError(
                f"--allow-origin takes an origin such as vscode-webview://* or "
                f"http://localhost:5173 (scheme://host[:port], no path), got {origin!r}"
            )
    if allow_origins and not http:
        raise ValidationError("--allow-origin is for the --http listener: add --http")
    root = Path(workspace or ".").resolve()
    if not root.is_dir():
        raise NotFoundError(f"workspace {root} is not a directory")
    lock = DaemonLock.try_acquire(root)
    if lock is None:
        click.echo(already_running(root))
        return 0

    def announce(doc: dict[str, Any]) -> None:
        if json_output:
            print(json.dumps(doc), flush=True)
        else:
            where = doc["socket"] + (f" and {doc['url']}" if doc.get("url") else "")
            print(f"rollbridge daemon listening on {where}", flush=True)
            for name in doc.get("adopted") or []:
                print(f"found live run {name}", flush=True)

    options = DaemonOptions(
        workspace=root, http=http, host=host, port=port, allow_origins=allow_origins
    )
    try:
        trio.run(run_daemon, options, lock, announce)
    finally:
        lock.release()
    sys.stdout.flush()
    return 0


@click.command("daemon")
@click.option("--workspace", default=None, help="Workspace directory (default: the current one).")
@click.option("--http", is_flag=True, help="Also listen on loopback HTTP with a bearer token.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback address for --http.")
@click.option("--port", type=int, default=0, help="Port for --http (default: ephemeral).")
@click.option(
    "--allow-origin",
    "allow_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Let pages of this browser origin call the --http listener with the token (CORS); "
    "scheme://* allows every origin of a scheme, e.g. vscode-webview://*. Repeatable.",
)
@click.option("--json", "json_output", is_flag=True, help="Print the ready line as JSON.")
@click.pass_context
def daemon_command(
    ctx: click.Context,
    workspace: str | None,
    http: bool,
    host: str,
    port: int,
    allow_origins: tuple[str, ...],
    json_output: bool,
) -> None:
    """Serve the workspace's control API (docs/daemon.md) until SIGINT or SIGTERM."""
    from launcher.cli_ui import output_mode

    json_flag = output_mode(ctx.obj, json_output, plain_flag=False) == "json"
    ctx.exit(daemon_main(workspace, http, host, port, json_flag, allow_origins))
