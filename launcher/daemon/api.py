"""The control API (JSON under ``/v1``, docs/daemon.md) as a raw ASGI app.

One app instance serves one listener. On the unix socket the kernel already proved the peer
(0700 directory, 0600 socket, ``SO_PEERCRED`` at accept), so no token is asked. On the loopback
HTTP listener every request passes :class:`launcher.daemon.door.HttpGuard` first: the bearer
token, an exact ``Host`` (against DNS rebinding), and no write from a browser origin other than
the daemon's own or one allowed with ``--allow-origin`` (whose CORS preflight it answers).
Request bodies are never logged: a start request may carry secrets.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import trio

from launcher.daemon.door import HttpGuard, with_headers
from launcher.daemon.live_usage import dispatched_in, live_rollouts, read_live_usage
from launcher.daemon.logscan import lines_naming
from launcher.daemon.registry import ApiError, Registry, parse_start
from launcher.daemon.routes_extra import ExtraRoutes, send_html
from launcher.daemon.status import RUN_STATES
from launcher.daemon.stream import MAX_TAIL, journal_events, log_events, tail_lines
from launcher.errors import CLIError
from launcher.rundir.calls import CALLS_FILENAME, read_calls
from launcher.rundir.projections import projection_stem
from rollout_server.net.asgi import (
    ASGIReceiveCallable,
    ASGISendCallable,
    BodyTooLarge,
    ClientDisconnected,
    HTTPScope,
    Scope,
    header,
    read_body,
    send_json,
)

__all__ = ["ControlApp"]

MAX_BODY = 1 << 20
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _json(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False).encode()


def _last_event_id(scope: HTTPScope, query: dict[str, list[str]]) -> int | None:
    """Where a stream resumes: ``Last-Event-ID`` (an EventSource's reconnect), else
    ``?after=N``; None when neither is given."""
    raw = header(scope, b"last-event-id")
    if raw is not None:
        text = raw.decode("latin-1")
    elif query.get("after"):
        text = query["after"][0]
    else:
        return None
    try:
        return max(0, int(text.strip()))
    except ValueError:
        raise ApiError(400, "VALIDATION", "Last-Event-ID must be an integer") from None


def _tail(query: dict[str, list[str]]) -> int:
    """``?tail=N``: 0 to :data:`MAX_TAIL` lines (100 when missing), else a 400."""
    text = (query.get("tail") or ["100"])[0]
    try:
        count = int(text)
    except ValueError:
        count = -1
    if not 0 <= count <= MAX_TAIL:
        raise ApiError(400, "VALIDATION", f"tail must be an integer from 0 to {MAX_TAIL} (lines)")
    return count


def _object(body: Any) -> dict[str, Any]:
    """A request body that must be a JSON object (an empty body is ``{}``)."""
    if not isinstance(body, dict):
        raise ApiError(400, "VALIDATION", "the request body must be a JSON object")
    return body


class ControlApp:
    """The ``/v1`` routes over a :class:`Registry`."""

    def __init__(
        self,
        registry: Registry,
        daemon_info: Callable[[], dict[str, Any]],
        request_shutdown: Callable[[bool], Awaitable[None]],
        guard: HttpGuard | None = None,
    ) -> None:
        self.registry = registry
        self._info = daemon_info
        self._shutdown = request_shutdown
        self._guard = guard
        self._extra = ExtraRoutes(registry, daemon_info, self._body, self._stream)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            return
        if self._guard is not None:
            guard = self._guard
            if header(scope, b"host") in guard.hosts:
                answer = guard.preflight(scope)
                if answer is not None:
                    # Browsers send a preflight without credentials: it is answered before the
                    # token check, and says only which methods and headers may follow.
                    await send({"type": "http.response.start", "status": 204, "headers": answer})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
            cors = guard.cors_headers(scope)
            if cors:
                send = with_headers(send, cors)
        try:
            await self._route(scope, receive, send)
        except ApiError as exc:
            body = _json({"error": {"code": exc.code, "message": exc.message}})
            await send_json(send, exc.status, body)
        except Exception as exc:
            # An IDE client always gets a JSON error; the traceback goes to the daemon's log
            # (hypercorn's own error log is off and would answer an empty 500).
            traceback.print_exc(file=sys.stderr)
            message = f"{type(exc).__name__}: {exc}"
            body = _json({"error": {"code": "INTERNAL", "message": message[:500]}})
            with contextlib.suppress(Exception):
                await send_json(send, 500, body)

    async def _route(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if self._guard is not None:
            refusal = self._guard.check(scope)
            if refusal is not None:
                raise refusal
        method = scope["method"]
        parts = [p for p in scope["path"].split("/") if p]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if parts[:1] != ["v1"]:
            raise ApiError(404, "NOT_FOUND", "no such route")
        route = parts[1:]
        if route == ["daemon"] and method == "GET":
            return await send_json(send, 200, _json(self._info()))
        if route == ["shutdown"] and method == "POST":
            cancel = _object(await self._body(scope, receive)).get("cancel_runs", False)
            if not isinstance(cancel, bool):
                raise ApiError(400, "VALIDATION", "cancel_runs must be of type bool")
            if self.registry.active() and not cancel:
                raise ApiError(409, "CONFLICT", "runs are active; pass cancel_runs to cancel them")
            await send_json(send, 202, _json({"shutting_down": True}))
            await self._shutdown(cancel)
            return None
        if route == ["runs"]:
            if method == "GET":
                states = query.get("state")
                state = states[0] if states else None
                if state is not None and state not in RUN_STATES:
                    valid = ", ".join(RUN_STATES)
                    raise ApiError(400, "VALIDATION", f"state must be one of: {valid}")
                runs = await trio.to_thread.run_sync(self.registry.summaries, state)
                return await send_json(send, 200, _json({"runs": runs}))
            if method == "POST":
                request = parse_start(await self._body(scope, receive))
                started = await self.registry.start(request)
                return await send_json(send, 202, _json(started))
        if len(route) >= 2 and route[0] == "runs":
            return await self._run_route(scope, receive, send, route[1], route[2:], query)
        if await self._extra.route(scope, receive, send, route, query):
            return None
        raise ApiError(404, "NOT_FOUND", "no such route")

    async def _run_route(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        name: str,
        rest: list[str],
        query: dict[str, list[str]],
    ) -> None:
        method = scope["method"]
        view = await trio.to_thread.run_sync(self.registry.view, name)
        if rest == [] and method == "GET":
            return await send_json(send, 200, _json(view.doc))
        if rest == ["cancel"] and method == "POST":
            stage = _object(await self._body(scope, receive)).get("stage", 1)
            if stage not in (1, 2):
                raise ApiError(400, "VALIDATION", "stage must be 1 or 2")
            return await send_json(send, 202, _json(self.registry.cancel(name, stage)))
        if rest == ["events"] and method == "GET":
            stream = journal_events(
                view.run_dir,
                after=_last_event_id(scope, query) or 0,
                live=lambda: self.registry.running(name),
                state=lambda: self._brief(name),
                usage_pid=lambda: self._live_pid(name),
            )
            return await self._stream(receive, send, stream)
        if rest == ["usage"] and method == "GET":
            usage = await trio.to_thread.run_sync(
                _usage, view.run_dir, view.doc, self._live_pid(name)
            )
            return await send_json(send, 200, _json(usage))
        if rest == ["report"] and method == "GET":
            page = await trio.to_thread.run_sync(_report, view.run_dir)
            return await send_html(send, page)
        if rest == ["logs"] and method == "GET":
            return await self._logs(scope, receive, send, view.run_dir, name, query)
        if len(rest) == 3 and rest[0] == "items" and method == "GET":
            item = await trio.to_thread.run_sync(_item, view.run_dir, rest[1], rest[2])
            return await send_json(send, 200, _json(item))
        if await self._extra.run_route(scope, receive, send, view, rest):
            return None
        raise ApiError(404, "NOT_FOUND", "no such route")

    def _live_pid(self, name: str) -> int | None:
        """The pid of run ``name``'s live child (whose ``usage_live.json`` counts), or None."""
        child = self.registry.child(name)
        return child.record.pid if child is not None and child.alive else None

    def _brief(self, name: str) -> dict[str, Any]:
        doc = self.registry.view(name).doc
        keys = (
            "state",
            "cause",
            "stage",
            "cancel_stage",
            "total",
            "done",
            "pending",
            "pass_rate",
            "error",
        )
        return {k: doc[k] for k in keys if k in doc}

    async def _logs(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        run_dir: Path,
        name: str,
        query: dict[str, list[str]],
    ) -> None:
        count = _tail(query)
        follow = (query.get("follow") or ["0"])[0] in ("1", "true")
        # A reconnecting follow (Last-Event-ID, or ?after=N) continues after the line it had;
        # the tail says only where a new follow starts.
        resume = _last_event_id(scope, query) if follow else None
        if resume is None:
            # A follow streams its backlog in bounded frames: only where it starts is needed.
            start, lines = await trio.to_thread.run_sync(
                partial(tail_lines, run_dir / "logs.txt", count, keep=not follow)
            )
            if not follow:
                return await send_json(send, 200, _json({"first_line": start + 1, "lines": lines}))
            resume = start
        stream = log_events(
            run_dir / "logs.txt", after=resume, live=lambda: self.registry.running(name)
        )
        await self._stream(receive, send, stream)

    async def _body(self, scope: HTTPScope, receive: ASGIReceiveCallable) -> Any:
        try:
            raw = await read_body(scope, receive, MAX_BODY)
        except BodyTooLarge as exc:
            raise ApiError(413, "TOO_LARGE", str(exc)) from None
        except ClientDisconnected:
            raise ApiError(
                400, "VALIDATION", "the request body did not arrive whole (cut off or malformed)"
            ) from None
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "VALIDATION", "the request body is not valid JSON") from None
        except RecursionError:
            raise ApiError(400, "VALIDATION", "the request body is nested too deeply") from None

    async def _stream(
        self, receive: ASGIReceiveCallable, send: ASGISendCallable, frames: AsyncIterator[bytes]
    ) -> None:
        """Send ``frames`` as one streamed response until they end or the client leaves."""
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        async with trio.open_nursery() as nursery:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_disconnect)
            async for chunk in frames:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()


def _usage(run_dir: Path, doc: dict[str, Any], pid: int | None) -> dict[str, Any]:
    """``GET /v1/runs/{name}/usage``: the rollouts in flight with their calls and tokens so
    far (``live`` is false when no child of this daemon dispatches), and what the journal
    already recorded."""
    live = read_live_usage(run_dir, pid)
    body = (
        # The work item of each rollout, from the log's lines folded since the last call only.
        live_rollouts(live, dispatched_in(run_dir / "logs.txt"))
        if live is not None
        else {
            "in_flight": None,
            "rollouts": [],
            "totals": None,
            "updated_at": None,
        }
    )
    return {
        "name": doc["name"],
        "state": doc["state"],
        "live": live is not None,
        **body,
        "recorded": {"done": doc["done"], "tokens": doc["tokens"]},
    }


def _report(run_dir: Path) -> str:
    """``GET /v1/runs/{name}/report``: ``rollbridge eval report``'s page, reloading itself
    while the run is in progress."""
    from launcher.reporting import load_run, render_report

    try:
        return render_report(load_run(run_dir), refresh=True)
    except CLIError as exc:
        raise ApiError.from_cli(exc.code, exc.message) from None


def _item(run_dir: Path, row: str, run: str) -> dict[str, Any]:
    """``GET /v1/runs/{name}/items/{row}/{run}``: the index row, the trajectory, the journal
    record, this item's log lines (errors and cancellations), its usage totals and its model
    calls' records (``calls.jsonl``, docs/calls.md)."""
    try:
        key = (int(row), int(run))
    except ValueError:
        raise ApiError(400, "VALIDATION", "row and run must be integers") from None
    index = None
    try:
        for line in (run_dir / "index.jsonl").read_text(encoding="utf-8").splitlines():
            doc = json.loads(line) if line.strip() else None
            if isinstance(doc, dict) and (doc.get("row_index"), doc.get("run_index")) == key:
                index = doc
    except (OSError, ValueError):
        index = None
    if index is None:
        raise ApiError(404, "NOT_FOUND", f"no result for row {key[0]} run {key[1]}")
    trajectory = None
    try:
        path = run_dir / "trajectories" / f"{projection_stem(*key)}.json"
        trajectory = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        trajectory = None
    rollout_id = str(index.get("rollout_id"))
    # Its warnings and errors, found without holding more than a block of the log at a time.
    log_lines = lines_naming(run_dir / "logs.txt", rollout_id, unless=" INFO ")
    try:
        trial = run_dir / "rollout_trials" / rollout_id / "diagnostics.json"
        diagnostics = json.loads(trial.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        diagnostics = None
    calls, _ = read_calls(run_dir / CALLS_FILENAME, [rollout_id])
    return {
        "index": index,
        "trajectory": trajectory,
        "error_type": index.get("error_type"),
        "diagnostics": diagnostics,
        "log_lines": log_lines,
        "usage": {
            "tokens": index.get("tokens"),
            "max_context_tokens": index.get("max_context_tokens"),
            "calls": index.get("calls"),
            "cached_tokens": index.get("cached_tokens"),
            "cache_write_tokens": index.get("cache_write_tokens"),
            "reasoning_tokens": index.get("reasoning_tokens"),
            "retries": index.get("retries"),
        },
        "metrics": index.get("metrics"),
        "calls": calls.get(rollout_id, []),
    }
