"""The daemon's lifetime: take the workspace lock, adopt live runs, bind, publish
``daemon.json``, serve until SIGINT/SIGTERM or ``POST /v1/shutdown``, then unpublish.

Runs are never stopped by a daemon exit (they are children in their own sessions, and their
run directories and records let the next daemon find them again); only a shutdown request
with ``cancel_runs`` cancels them first.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from launcher.daemon.api import ControlApp
from launcher.daemon.discovery import (
    DaemonInfo,
    DaemonLock,
    live_daemon,
    read_discovery,
    remove_discovery,
    socket_path,
    write_discovery,
)
from launcher.daemon.door import HttpGuard
from launcher.daemon.listen import bind_tcp, bind_unix, serve
from launcher.daemon.registry import Registry
from launcher.process import start_token
from launcher.ui import CLI_VERSION

__all__ = ["DaemonOptions", "already_running", "run_daemon"]

#: How long ``cancel_runs`` waits for the runs to stop (stage 2 after half of it).
SHUTDOWN_CANCEL_S = 60.0


@dataclass(frozen=True)
class DaemonOptions:
    """``rollbridge daemon`` flags."""

    workspace: Path
    http: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    allow_origins: tuple[str, ...] = ()
    """Browser origins (beyond the daemon's own) allowed to call the ``--http`` listener."""


def already_running(workspace: Path, wait_s: float = 5.0) -> str:
    """The ``already running (pid …, socket …)`` line for a daemon that holds the lock (waits
    briefly for its ``daemon.json``, which it writes right after binding)."""
    info: DaemonInfo | None = None
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        info = live_daemon(workspace)
        if info is not None:
            break
        time.sleep(0.05)
    info = info or read_discovery(workspace)
    pid = info.pid if info else "?"
    sock = info.socket if info else "?"
    return f"already running (pid {pid}, socket {sock})"


async def run_daemon(
    options: DaemonOptions,
    lock: DaemonLock,
    announce: Callable[[dict[str, Any]], None],
) -> None:
    """Serve until a signal or a shutdown request. ``lock`` is already held."""
    token = secrets.token_urlsafe(32) if options.http else None
    # Bound before anything else: a refused --host or a busy port is one line, and leaves
    # no socket file behind.
    tcp_sock: socket.socket | None = None
    url = None
    if options.http:
        tcp_sock = bind_tcp(options.host, options.port)
        port = tcp_sock.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
    try:
        await _serve_daemon(options, lock, announce, token, tcp_sock, url)
    finally:
        if tcp_sock is not None:
            tcp_sock.close()


async def _serve_daemon(
    options: DaemonOptions,
    lock: DaemonLock,
    announce: Callable[[dict[str, Any]], None],
    token: str | None,
    tcp_sock: socket.socket | None,
    url: str | None,
) -> None:
    workspace = options.workspace
    pid = os.getpid()
    stop = trio.Event()
    cancel_runs = False
    async with trio.open_nursery() as nursery:
        registry = Registry(workspace, nursery)
        adopted = registry.adopt()
        unix_path = socket_path(workspace)
        unix_sock = bind_unix(unix_path)
        info = DaemonInfo(
            pid=pid,
            start_token=start_token(pid) or "",
            socket=str(unix_path),
            version=CLI_VERSION,
            workspace=str(workspace),
            url=url,
            token=token,
        )

        def daemon_info() -> dict[str, Any]:
            return {
                "version": CLI_VERSION,
                "pid": pid,
                "workspace": str(workspace),
                "socket": str(unix_path),
                "url": url,
                "runs_active": registry.active(),
                "capabilities": [
                    "runs",
                    "events",
                    "cancel",
                    "logs",
                    "items",
                    "usage",
                    "report",
                    "shutdown",
                    "health",
                    "workspace",
                    "validate",
                    "workspace_events",
                    "diff",
                    "export",
                    "rubric",
                    "openapi",
                    "config_schema",
                ],
            }

        async def request_shutdown(cancel: bool) -> None:
            nonlocal cancel_runs
            cancel_runs = cancel
            stop.set()

        listeners: list[tuple[socket.socket, Any]] = [
            (unix_sock, ControlApp(registry, daemon_info, request_shutdown))
        ]
        if tcp_sock is not None:
            guard = HttpGuard(
                token=token or "",
                port=tcp_sock.getsockname()[1],
                origins=frozenset(o.encode() for o in options.allow_origins),
            )
            listeners.append((tcp_sock, ControlApp(registry, daemon_info, request_shutdown, guard)))
        try:
            await nursery.start(serve, listeners)
            write_discovery(workspace, info)
            # The token is in daemon.json (0600) only: never in what is announced.
            announce(
                {
                    "ready": True,
                    "pid": pid,
                    "socket": str(unix_path),
                    "url": url,
                    "adopted": adopted,
                }
            )
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as waiters:

                    async def on_signal() -> None:
                        async for _ in signals:
                            stop.set()
                            return

                    waiters.start_soon(on_signal)
                    await stop.wait()
                    waiters.cancel_scope.cancel()
            if cancel_runs:
                await registry.cancel_all(SHUTDOWN_CANCEL_S)
        finally:
            remove_discovery(workspace, info)
            unix_path.unlink(missing_ok=True)
            nursery.cancel_scope.cancel()
            unix_sock.close()
            lock.release()
