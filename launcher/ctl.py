"""``rollbridge ctl``: a thin client of the workspace daemon's control API (docs/daemon.md).

It finds the daemon through ``.osmosis/daemon.json`` (trusted only when its pid is alive with
the recorded start token) and talks to it over the unix socket with httpx. Every subcommand is
one API call; ``watch`` renders the event stream and resumes with ``Last-Event-ID`` when the
connection drops, or when the daemon restarts (it waits up to a minute for the next one).
Errors are the API's one-line messages: ``Error: …`` and exit code 1.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import click
import msgspec

from launcher import completion as complete
from launcher.errors import CLIError, NotFoundError
from launcher.run_flags import shard_and_ray_options

__all__ = ["WATCH_RECONNECT_S", "ctl"]

#: How long ``ctl watch`` waits for a daemon to answer again (one restarting) before it stops.
WATCH_RECONNECT_S = 60.0
#: The pause between its attempts.
WATCH_RETRY_S = 0.5


class _Client:
    """Sync httpx over the daemon's unix socket."""

    def __init__(self, workspace: str | None) -> None:
        import httpx

        from launcher.daemon.discovery import live_daemon

        root = Path(workspace or ".").resolve()
        info = live_daemon(root)
        if info is None:
            raise NotFoundError(
                f"no rollbridge daemon is running for {root}; start one with `rollbridge daemon`"
            )
        self.http = httpx.Client(
            transport=httpx.HTTPTransport(uds=info.socket),
            base_url="http://daemon",
            timeout=httpx.Timeout(60.0, read=None),
        )

    def call(self, method: str, path: str, body: Any = None) -> Any:
        response = self.http.request(method, path, json=body)
        doc = response.json()
        if response.status_code >= 400:
            error = doc.get("error", {}) if isinstance(doc, dict) else {}
            raise CLIError(str(error.get("message", response.text)), code=error.get("code"))
        return doc


def _print(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


@click.group("ctl")
@click.option("--workspace", default=None, help="Workspace of the daemon (default: current).")
@click.pass_context
def ctl(ctx: click.Context, workspace: str | None) -> None:
    """Drive the workspace daemon: start, list, watch, cancel and inspect runs."""
    ctx.ensure_object(dict)
    ctx.obj["ctl_workspace"] = workspace


def _client(ctx: click.Context) -> _Client:
    return _Client(ctx.obj.get("ctl_workspace"))


@ctl.command("start")
@click.argument("config", shell_complete=complete.files)
@click.option("--name", default=None, help="Run name; re-using a name resumes its pending work.")
@click.option("--rows", default=None, help="Source rows to run, for example '3,7,10-20'.")
@click.option("--limit", type=int, default=None, help="Run only the first N rows.")
@click.option("--fresh", is_flag=True, default=None, help="Archive the existing results first.")
@click.option("--retry-failed", is_flag=True, default=None, help="Also re-run failed items.")
@click.option("--max-in-flight", type=int, default=None, help="Concurrent rollouts.")
@click.option("--tunnel", default=None, help="Force a managed tunnel (only 'cloudflared').")
@click.option("--advertise-url", default=None, help="Public base URL reaching the bridge.")
@click.option("--listener-port", type=int, default=None, help="Fixed model-bridge port.")
@click.option("--secrets-file", default=None, help="Dotenv file the run reads (path only).")
@shard_and_ray_options
@click.pass_context
def start(ctx: click.Context, /, config: str, **flags: Any) -> None:
    """Start (or resume, with the same --name) a run of CONFIG."""
    # An unset option is None (a flag's False); 0 is a value (``--limit 0`` is refused by the run).
    given = {k: v for k, v in flags.items() if v is not None and v is not False}
    body = {"config": config, **given}
    if body.get("secrets_file"):
        body["secrets_file"] = str(Path(body["secrets_file"]).resolve())
    _print(_client(ctx).call("POST", "/v1/runs", body))


@ctl.command("list")
@click.option("--state", default=None)
@click.pass_context
def list_runs(ctx: click.Context, state: str | None) -> None:
    """Every run with its state."""
    doc = _client(ctx).call("GET", "/v1/runs" + (f"?state={state}" if state else ""))
    for run in doc["runs"]:
        total = "?" if run.get("total") is None else run["total"]
        click.echo(f"{run['name']}\t{run['state']}\t{run['done']}/{total}")


@ctl.command("status")
@click.argument("name", required=False)
@click.pass_context
def status(ctx: click.Context, name: str | None) -> None:
    """One run's progress (or the daemon's own status without NAME)."""
    _print(_client(ctx).call("GET", f"/v1/runs/{name}" if name else "/v1/daemon"))


@ctl.command("cancel")
@click.argument("name")
@click.option("--stage", type=click.IntRange(1, 2), default=1, show_default=True)
@click.pass_context
def cancel(ctx: click.Context, name: str, stage: int) -> None:
    """Cancel a run: stage 1 = first Ctrl-C, stage 2 = second."""
    _print(_client(ctx).call("POST", f"/v1/runs/{name}/cancel", {"stage": stage}))


@ctl.command("logs")
@click.argument("name")
@click.option("--tail", type=int, default=100, show_default=True)
@click.pass_context
def logs(ctx: click.Context, name: str, tail: int) -> None:
    """The last lines of a run's (redacted) logs.txt."""
    for line in _client(ctx).call("GET", f"/v1/runs/{name}/logs?tail={tail}")["lines"]:
        click.echo(line)


@ctl.command("item")
@click.argument("name")
@click.argument("row", type=int)
@click.argument("run", type=int, default=0)
@click.pass_context
def item(ctx: click.Context, name: str, row: int, run: int) -> None:
    """One work item: index row, trajectory, diagnostics, usage."""
    _print(_client(ctx).call("GET", f"/v1/runs/{name}/items/{row}/{run}"))


@ctl.command("watch")
@click.argument("name")
@click.option("--after", type=int, default=0, help="Resume after this journal line.")
@click.option("--json", "as_json", is_flag=True, help="Print each event as one JSON line.")
@click.pass_context
def watch(ctx: click.Context, name: str, after: int, as_json: bool) -> None:
    """Follow a run's event stream until it ends (reconnecting after a dropped connection):
    one line per finished work item and per milestone, or with --json every event as
    ``{"event", "id", "data"}``."""
    import httpx

    from launcher.cli_ui import output_mode

    # The root's --json counts as this one's; --plain with --json anywhere is a usage error.
    as_json = output_mode(ctx.find_root().obj, as_json, False) == "json"
    client = _client(ctx)
    last = after
    render = _render_json if as_json else _Renderer()
    gone_since: float | None = None  # since when no daemon answers (one restarting)
    while True:
        try:
            with client.http.stream(
                "GET", f"/v1/runs/{name}/events", headers={"Last-Event-ID": str(last)}
            ) as response:
                gone_since = None
                if response.status_code >= 400:
                    response.read()
                    error = response.json().get("error", {})
                    raise CLIError(str(error.get("message")), code=error.get("code"))
                for event, event_id, data in _frames(response.iter_lines()):
                    if event_id is not None:
                        last = event_id
                    if render(event, event_id, data):
                        return
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError):
            # A dropped stream, or a daemon restarting (its socket is gone for a moment):
            # the runs carry on without it, so wait for the next one and resume after `last`.
            now = time.monotonic()
            gone_since = now if gone_since is None else gone_since
            if now - gone_since > WATCH_RECONNECT_S:
                raise CLIError(
                    f"the daemon stopped answering and none came back within "
                    f"{WATCH_RECONNECT_S:g} s; once one runs, `rollbridge ctl watch {name} "
                    f"--after {last}` goes on from here"
                ) from None
            time.sleep(WATCH_RETRY_S)
            with contextlib.suppress(NotFoundError):
                fresh = _client(ctx)
                client.http.close()
                client = fresh


def _frames(lines: Any) -> Any:
    """``(event, id, data)`` for each SSE frame of ``lines``."""
    event, event_id, data = "message", None, ""
    for line in lines:
        if line == "":
            if data:
                yield event, event_id, json.loads(data)
            event, event_id, data = "message", None, ""
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            data += line[6:]


def _render_json(event: str, event_id: int | None, data: Any) -> bool:
    """``--json``: the event as it came; True at the end of the stream."""
    click.echo(json.dumps({"event": event, "id": event_id, "data": data}, ensure_ascii=False))
    return event == "end"


#: Milestone messages end with the log line's details as JSON; a reader wants the words.
_DETAILS = re.compile(r"\s+\{.*\}$")


class _Renderer:
    """The readable form: ``row 3 run 0: success, reward 1`` per finished item (as a piped
    ``eval run`` prints it), ``→ message`` per milestone and per change of a ``--ray`` run's
    replicas, a state line when the state changes, and ``finished 21/21, pass 100%`` at the
    end."""

    def __init__(self) -> None:
        self.state: str | None = None

    def __call__(self, event: str, event_id: int | None, data: Any) -> bool:
        if event == "record":
            from launcher.report import describe
            from launcher.rundir.records import TerminalRecord

            try:
                click.echo(describe(msgspec.convert(data, TerminalRecord)))
            except msgspec.ValidationError:
                click.echo(f"row {data.get('row_index')} run {data.get('run_index')}: ?")
        elif event == "stage":
            click.echo(f"→ {_DETAILS.sub('', str(data.get('message', '')))}")
        elif event == "replicas" and isinstance(data, dict) and data.get("line"):
            # A --ray run's replica set changed (a replica suspect, lost, draining, added).
            click.echo(f"→ {data['line']}")
        elif event == "state" and data.get("state") != self.state:
            self.state = data.get("state")
            stage = f" ({data['stage']})" if data.get("stage") else ""
            click.echo(f"[{self.state}{stage}] {data.get('done')}/{data.get('total')}")
        elif event == "end":
            click.echo(_end_line(data))
            return True
        return False


def _end_line(data: dict[str, Any]) -> str:
    """``finished 21/21, pass 100%`` (plus the cause of a run that did not finish)."""
    text = f"{data.get('state')} {data.get('done')}/{data.get('total')}"
    if isinstance(data.get("pass_rate"), int | float):
        text += f", pass {data['pass_rate']:.0%}"
    if data.get("state") != "finished" and data.get("cause"):
        text += f": {data['cause']}"
    return text
