"""A plain-HTTP/1.1 server for :class:`LeanConfig` apps that needs none of hypercorn's worker.

:func:`serve_lean` listens on the config's binds and serves every connection with
:func:`rollout_server.net.h1.serve_h1`, without importing hypercorn's worker:
``hypercorn.trio`` brings hypercorn's HTTP/2, h2c and WebSocket protocol layers (h2, wsproto,
priority), a fifth of a second of CPU at every start of a process that never uses them. This
module imports only hypercorn's config (for the socket options and the settings it shares
with hypercorn).

What it serves like hypercorn's worker with a :class:`LeanConfig`: the binds, ``backlog``,
``keep_alive_timeout``, ``keep_alive_max_requests``, ``read_timeout``, ``root_path`` and
``graceful_timeout``, plus the floor's :attr:`LeanConfig.limits`. At shutdown it stops
accepting, closes idle keep-alive connections at once, lets a request in progress finish
within ``graceful_timeout`` and then cancels what is left. It does not run the ASGI lifespan
protocol (the rollout server starts and stops its service itself). A config with TLS (which
nothing in rollbridge builds) is handed to hypercorn's own worker, imported then, and gets
hypercorn's HTTP stack and limits rather than this floor's.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import trio
from hypercorn.config import Config

from .h1 import serve_h1
from .limits import Limits, default_max_connections


class _Signal(Protocol):
    """What :class:`IdleWatch` needs of a shutdown event (trio's, or hypercorn's)."""

    async def wait(self) -> Any: ...

    def is_set(self) -> bool: ...


if TYPE_CHECKING:
    from hypercorn.typing import ASGIFramework

__all__ = ["Admission", "IdleWatch", "LeanConfig", "serve_connection", "serve_lean"]


class LeanConfig(Config):
    """A hypercorn :class:`~hypercorn.config.Config` (for its binds, socket options and
    timeouts) whose connections :func:`serve_lean` serves with
    :func:`~rollout_server.net.h1.serve_h1` (the app runs in the connection's task).

    :attr:`limits` bounds every connection (:mod:`rollout_server.net.limits`); hypercorn's
    ``h11_max_incomplete_size`` is not used.
    """

    limits: Limits = Limits()
    _admission: Admission | None = None

    @property
    def admission(self) -> Admission:
        """The server's connection cap (one per config: its listeners share it)."""
        if self._admission is None:
            self._admission = Admission(self.limits.max_connections or default_max_connections())
        return self._admission


class Admission:
    """At most ``limit`` connections of one server at once (:mod:`.limits`).

    A connection past the limit closes the one idle longest, or is refused (closed unread)
    when every connection is working. Trio's accept loop would otherwise take connections
    until the process runs out of descriptors, then log an EMFILE error ten times a second
    while the callers that are working wait.
    """

    __slots__ = ("_open", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: set[IdleWatch] = set()

    def admit(self, watch: IdleWatch) -> bool:
        """Count ``watch``'s connection in, making room if it can; False: refuse it."""
        if len(self._open) >= self.limit:
            oldest = min(
                (w for w in self._open if w.idle), key=lambda w: w.idle_until, default=None
            )
            if oldest is None:
                return False
            oldest.evict()
            self._open.discard(oldest)
        self._open.add(watch)
        return True

    def leave(self, watch: IdleWatch) -> None:
        """``watch``'s connection is closed."""
        self._open.discard(watch)


async def serve_lean(
    app: ASGIFramework,
    config: LeanConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    sockets: list[socket.socket] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``config``'s binds until ``shutdown_trigger`` returns (or forever).

    ``sockets``: already bound TCP sockets to serve instead of the binds (the caller bound them
    to report a bind failure its own way; they must not be TLS binds). Reports the bound
    addresses (``http://host:port``, like ``hypercorn.trio.serve``) through ``task_status``.
    Returns when every connection is closed (at most ``graceful_timeout`` seconds after the
    trigger).
    """
    if config.ssl_enabled and sockets is not None:
        raise ValueError("pre-bound sockets are served as plain HTTP: the config asks for TLS")
    if config.ssl_enabled:
        from hypercorn.trio import serve

        await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
        return
    if sockets is None:
        sockets = config.create_sockets().insecure_sockets
    listeners = []
    binds = []
    for sock in sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        binds.append(f"http://{_bind_text(sock)}")
    closing = trio.Event()
    handler = partial(serve_connection, app, config, closing)
    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            await accepting.start(
                partial(trio.serve_listeners, handler, listeners, handler_nursery=connections)
            )
            task_status.started(binds)
            await (shutdown_trigger or trio.sleep_forever)()
            accepting.cancel_scope.cancel()
        closing.set()
        connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


def _bind_text(sock: socket.socket) -> str:
    address = sock.getsockname()
    if sock.family == socket.AF_INET6:
        return f"[{address[0]}]:{address[1]}"
    if sock.family == socket.AF_INET:
        return f"{address[0]}:{address[1]}"
    return f"unix:{address}"


class _AppWrapper:
    """An ASGI 3 app in the calling convention :func:`serve_h1` uses (hypercorn's)."""

    __slots__ = ("app",)

    def __init__(self, app: ASGIFramework) -> None:
        self.app = app

    async def __call__(
        self, scope: Any, receive: Any, send: Any, sync_spawn: Any, call_soon: Any
    ) -> None:
        await self.app(scope, receive, send)


async def serve_connection(
    app: ASGIFramework,
    config: LeanConfig,
    closing: trio.Event,
    stream: trio.abc.Stream,
    sock: trio.socket.SocketType | None = None,
) -> None:
    """Serve one accepted connection with ``app`` until it ends, then close it.

    ``closing`` is the server's shutdown signal: an idle connection closes at once when it is
    set. For accept loops of their own (the daemon's listeners check the peer first).
    ``sock``: the TCP socket under ``stream`` when ``stream`` is not a ``trio.SocketStream``
    (a ``trio.SSLStream``: the bridge's cluster door, :mod:`bridge.tls`).
    """
    if sock is None:
        assert isinstance(stream, trio.SocketStream)
        sock = stream.socket
    # A plain TCP stream closes at once: ``stream.aclose()`` is the socket's close() and a
    # checkpoint, and the close() alone is enough in the finally. trio.aclose_forcefully
    # would wrap each in a cancelled scope, whose Cancelled costs ~0.1 ms per connection: a
    # server with a thousand connections paid ~0.2 s for them at shutdown
    # (scripts/bench/bench_wire_connect.py measures the three ways).
    idle = IdleWatch(closing, config.keep_alive_timeout, stream.aclose, config.limits.send_timeout)
    admission = config.admission
    if not admission.admit(idle):
        sock.close()
        return
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(idle.watch)
            await serve_h1(
                _AppWrapper(app),
                config,
                stream,
                {},
                on_idle=idle.enter,
                on_busy=idle.leave,
                sock=sock,
                writes=idle.watch_writes,
            )
            nursery.cancel_scope.cancel()
    except OSError:
        pass
    finally:
        admission.leave(idle)
        sock.close()


class IdleWatch:
    """Closes a connection once it has been idle ``timeout`` seconds, or is idle at shutdown,
    or has waited ``send_timeout`` seconds for its client to take a write (limits.SEND_TIMEOUT).

    One task per connection (:meth:`watch`) sleeps until the next of those deadlines and looks
    again; a request costs two attribute writes (:meth:`leave`, then :meth:`enter` when it is
    answered), a write two more (its start, read through :meth:`watch_writes`). The task
    wakes at least every ``send_timeout`` (and when a write it saw would be late), so a
    stalled write is closed within twice that. ``closing`` is the server's shutdown signal
    (anything with ``wait()`` and ``is_set()``); ``close`` closes the connection, which ends
    its loop (a write waiting on it fails, and the app's ``receive()`` says the client left).
    """

    __slots__ = (
        "_close",
        "_closing",
        "_deadline",
        "_evicted",
        "_idle",
        "_resumed",
        "_send_timeout",
        "_sleep",
        "_timeout",
        "_writing",
    )

    def __init__(
        self,
        closing: _Signal,
        timeout: float,
        close: Callable[[], Awaitable[None]],
        send_timeout: float = math.inf,
    ) -> None:
        self._closing = closing
        self._timeout = timeout
        self._close = close
        self._send_timeout = send_timeout
        self._idle = False
        self._deadline = math.inf
        self._resumed = trio.Event()
        self._evicted = False
        self._sleep: trio.CancelScope | None = None
        self._writing: Callable[[], float] = _no_write

    @property
    def idle(self) -> bool:
        """Whether the connection waits for a request."""
        return self._idle

    @property
    def idle_until(self) -> float:
        """When the idle connection's timeout ends (the earliest went idle first)."""
        return self._deadline

    def watch_writes(self, writing_since: Callable[[], float]) -> None:
        """Bound the connection's writes: ``writing_since()`` says when the write in progress
        began (``inf``: none)."""
        self._writing = writing_since

    def evict(self) -> None:
        """Close the connection now if it is idle, else as soon as it is (to make room)."""
        self._evicted = True
        if self._sleep is not None:
            self._sleep.deadline = -math.inf

    async def enter(self) -> None:
        """The connection waits for a request: (re)start the countdown."""
        self._idle = True
        self._deadline = trio.current_time() + self._timeout
        self._resumed.set()

    async def leave(self) -> None:
        """A request arrived: the connection is busy, not idle."""
        self._idle = False

    async def watch(self) -> None:
        """Run until the connection must close (see the class), then close it."""
        while True:
            now = trio.current_time()
            if self._idle:
                if self._evicted or self._closing.is_set() or now >= self._deadline:
                    break
                # Not past the send timeout either: a request that comes meanwhile does not
                # wake this task (leave() is an attribute write), and its answer's write must
                # still be looked at in time.
                wake = min(self._deadline, now + self._send_timeout)
            else:
                began = self._writing()
                if now - began >= self._send_timeout:
                    break  # the client has not taken this write for send_timeout
                wake = min(began, now) + self._send_timeout
            # A request that came and went meanwhile moved the deadline: look again.
            with trio.move_on_at(wake) as sleep:
                self._sleep = sleep
                if self._idle and not self._closing.is_set():
                    await self._closing.wait()
                else:  # busy (or closing): until it is idle again, or the wake
                    self._resumed = trio.Event()
                    await self._resumed.wait()
            self._sleep = None
        with trio.CancelScope(shield=True):
            await self._close()


def _no_write() -> float:
    return math.inf
