"""The daemon's listeners: a unix socket (0600, in a 0700 directory, peer uid checked with
``SO_PEERCRED`` at accept) and an optional loopback TCP socket, each served by the lean
HTTP/1.1 loop (:func:`rollout_server.net.leanserve.serve_connection`) with its own app, under
the floor's limits (:mod:`rollout_server.net.limits`: head size and count, head and body read
timeouts, no draining of a refused body).

The accept loop is ours so a connection from another uid is closed before a byte of it is read
(on Linux; elsewhere the directory and socket modes are the barrier).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from functools import partial
from pathlib import Path

import trio

from launcher.errors import ValidationError
from rollout_server.net.asgi import ASGIFramework
from rollout_server.net.hosts import is_loopback_host
from rollout_server.net.leanserve import LeanConfig, serve_connection

__all__ = ["bind_tcp", "bind_unix", "peer_uid", "serve"]


def bind_unix(path: Path) -> socket.socket:
    """Bind and listen on ``path`` with mode 0600 (a stale socket file is replaced: the caller
    holds the daemon lock, so nobody else serves it)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(os.fspath(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    """Bind a loopback TCP listener; any other address is refused."""
    if not is_loopback_host(host):
        raise ValidationError(f"--host must be a loopback address, got {host}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1" if host == "localhost" else host, port))
    except OSError as exc:
        sock.close()
        raise ValidationError(f"could not bind the daemon on {host}:{port}: {exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def peer_uid(sock: trio.socket.SocketType) -> int | None:
    """The uid of a unix-socket peer (Linux ``SO_PEERCRED``), or None where unsupported."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or not sys.platform.startswith("linux"):
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


async def serve(
    listeners: list[tuple[socket.socket, ASGIFramework]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve each socket with its app until cancelled."""
    config = LeanConfig()
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 75.0
    # The daemon stops by cancellation; idle connections close with it.
    closing = trio.Event()
    uid = os.getuid()
    async with trio.open_nursery() as nursery:
        for sock, app in listeners:
            is_unix = sock.family == socket.AF_UNIX
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))

            async def handle(
                stream: trio.SocketStream, app: ASGIFramework = app, is_unix: bool = is_unix
            ) -> None:
                if is_unix:
                    peer = peer_uid(stream.socket)
                    if peer is not None and peer != uid:
                        await stream.aclose()
                        return
                await serve_connection(app, config, closing, stream)

            nursery.start_soon(partial(trio.serve_listeners, handle, [listener]))
        task_status.started()
