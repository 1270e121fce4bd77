"""Fewer writes per HTTP/1.1 response from hypercorn's trio worker.

Hypercorn writes a response's head and its body in separate ``send`` calls. On loopback each
write wakes the reader once more (another receive, another parse, another scheduler pass),
which costs CPU on both ends and latency on a busy machine. :class:`CoalescingConfig` makes
the trio worker hold the head back until the first piece of body (or the end of an empty
body) and write both at once. The bytes on the wire are unchanged; a streamed response still
leaves with its first chunk, as before, because hypercorn only writes the head when the
application sends its first body message anyway.

It also replaces hypercorn's keep-alive idle timer, which cancels a task when a request
arrives and starts a new one (``nursery.start``, under a lock) when the response is done: about
a sixth of the server's CPU per trivial request. :class:`_IdleTimer` keeps one task per
connection that sleeps until the idle deadline and re-checks it, so a request costs two
attribute writes. Idle connections still close ``keep_alive_timeout`` seconds after their
last response, and at once when the server shuts down, as before.

Both rely on hypercorn internals, so nothing changes until :func:`install_write_coalescing`
is called (the rollout server and the bridge call it when they start). It checks that the
installed hypercorn is one this module was written against and still has the internals it
uses; otherwise it logs a warning and leaves hypercorn alone, and a :class:`CoalescingConfig`
then serves exactly like a plain ``Config``. Once installed, only servers started with a
:class:`CoalescingConfig` behave differently; every other hypercorn server in the process
(the patch replaces hypercorn's trio TCP server class for all of them) keeps hypercorn's own
behaviour.

:class:`LeanConfig` goes one step further for servers whose answers are small and whole (the
rollout server): its plain HTTP/1.1 connections skip hypercorn's protocol layers and are served
by :func:`rollout_server.net.h1.serve_h1`, with the app called in the connection's own task
(that module says what this changes for an app). TLS connections still go through hypercorn.
Both configs are defined in :mod:`rollout_server.net.leanserve` (whose :func:`serve_lean` serves
a :class:`LeanConfig` without hypercorn's worker) and re-exported here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import metadata
from typing import Any, Final

import h11
import hypercorn.trio.run as _hypercorn_run
import trio
from hypercorn.config import Config
from hypercorn.events import Event, RawData
from hypercorn.trio.task_group import TaskGroup as _TrioTaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import TrioSingleTask, WorkerContext
from hypercorn.typing import AppWrapper, LifespanState, TaskGroup
from hypercorn.typing import Event as WorkerEvent

from .h1 import serve_h1
from .leanserve import CoalescingConfig, IdleWatch, LeanConfig

__all__ = ["TESTED_HYPERCORN", "CoalescingConfig", "LeanConfig", "install_write_coalescing"]

logger = logging.getLogger(__name__)

TESTED_HYPERCORN: Final = ((0, 17), (0, 19))
"""The hypercorn minor versions (from inclusive, to exclusive) whose internals this module fits."""

# The name under which hypercorn's trio worker looks its TCP server class up per connection.
_SERVER_CLASS: Final = "TCPServer"
# Everything of hypercorn's that the subclasses below override or call.
_INTERNALS: Final = (
    (TCPServer, ("run", "_read_data", "protocol_send", "_initiate_server_close", "_close")),
    (Config, ("h11_max_incomplete_size", "read_timeout", "keep_alive_max_requests", "root_path")),
    (TrioSingleTask, ("restart", "stop")),
    (_TrioTaskGroup, ("spawn",)),
)


def install_write_coalescing() -> bool:
    """Make servers started with a :class:`CoalescingConfig` coalesce; ``True`` when they will.

    Idempotent. When the installed hypercorn is outside :data:`TESTED_HYPERCORN` or lacks an
    internal the patch needs, it logs a warning naming the problem, changes nothing and
    returns ``False``: those servers then behave as plain hypercorn, which is correct, only
    a little more expensive per request.
    """
    current = getattr(_hypercorn_run, _SERVER_CLASS, None)
    if current is _CoalescingTCPServer:
        return True
    problem = _incompatibility(_installed_hypercorn(), current)
    if problem is not None:
        logger.warning("hypercorn write coalescing is off: %s", problem)
        return False
    setattr(_hypercorn_run, _SERVER_CLASS, _CoalescingTCPServer)
    return True


def _installed_hypercorn() -> str:
    try:
        return metadata.version("hypercorn")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def _incompatibility(version: str, server_class: object) -> str | None:
    """Why the patch must not be installed over hypercorn ``version``, or ``None``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    low, high = TESTED_HYPERCORN
    if found is None or not low <= (int(found[1]), int(found[2])) < high:
        tested = f"{low[0]}.{low[1]} up to (not including) {high[0]}.{high[1]}"
        return f"hypercorn {version} is installed, the patch fits {tested}"
    if server_class is not TCPServer:
        return f"hypercorn.trio.run.{_SERVER_CLASS} is not hypercorn's trio TCPServer"
    for owner, names in _INTERNALS:
        for name in names:
            if not hasattr(owner, name):
                return f"hypercorn {version} has no {owner.__name__}.{name}"
    return None


class _IdleTimer(TrioSingleTask):
    """Closes a keep-alive connection idle for ``timeout`` seconds, or idle at shutdown.

    Stands in for hypercorn's ``TrioSingleTask`` (same ``restart``/``stop`` calls), with one
    long-lived task (:class:`~.leanserve.IdleWatch`) instead of a new one per response.
    """

    def __init__(
        self, terminated: WorkerEvent, timeout: float, close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__()
        self._watch = IdleWatch(terminated, timeout, close)
        self._scope: trio.CancelScope | None = None

    async def restart(self, task_group: TaskGroup, action: Callable[..., Any]) -> None:
        """The connection went idle: (re)start the countdown. ``action`` is not needed."""
        if self._scope is None:
            self._scope = trio.CancelScope()
            task_group.spawn(self._run, self._scope)
        await self._watch.enter()

    async def stop(self) -> None:
        """A request arrived: the connection is busy, not idle."""
        await self._watch.leave()

    def cancel(self) -> None:
        """The connection is over: end the watching task."""
        if self._scope is not None:
            self._scope.cancel()

    async def _run(self, scope: trio.CancelScope) -> None:
        with scope:
            await self._watch.watch()


class _CoalescingTCPServer(TCPServer):
    def __init__(
        self,
        app: AppWrapper,
        config: Config,
        context: WorkerContext,
        state: LifespanState,
        stream: trio.SSLStream[trio.SocketStream],
    ) -> None:
        super().__init__(app, config, context, state, stream)
        self._coalesce = isinstance(config, CoalescingConfig)
        self._lean = isinstance(config, LeanConfig) and isinstance(stream, trio.SocketStream)
        self._in_body = False
        self._held: bytes | None = None
        if self._coalesce:
            self._idle_timer = _IdleTimer(
                self.context.terminated, config.keep_alive_timeout, self._close_idle
            )
            self.idle_task = self._idle_timer

    async def run(self) -> None:
        if not self._lean:
            await super().run()
            return
        stream = self.stream
        assert isinstance(stream, trio.SocketStream)
        timer = self._idle_timer
        try:
            async with _TrioTaskGroup() as task_group:
                await serve_h1(
                    self.app,
                    self.config,
                    stream,
                    self.state,
                    on_idle=partial(timer.restart, task_group, self._idle_timeout),
                    on_busy=timer.stop,
                )
                timer.cancel()
        except OSError:
            pass
        finally:
            timer.cancel()
            await self._close()

    async def _close_idle(self) -> None:
        if self._lean:
            await self.stream.aclose()
        else:
            await self._initiate_server_close()

    async def _read_data(self) -> None:
        try:
            await super()._read_data()
        finally:
            if self._coalesce:
                self._idle_timer.cancel()

    async def protocol_send(self, event: Event) -> None:
        if not self._coalesce:
            await super().protocol_send(event)
            return
        if type(event) is RawData:
            connection = getattr(getattr(self.protocol, "protocol", None), "connection", None)
            if getattr(connection, "our_state", None) is h11.SEND_BODY:
                if not self._in_body:
                    # The head of a response: it waits for the body's first bytes.
                    self._in_body = True
                    self._held = event.data
                    return
            else:
                self._in_body = False
            if self._held is not None:
                event = RawData(data=self._held + event.data)
                self._held = None
            if not event.data:
                return
        elif self._held is not None:
            held, self._held = self._held, None
            await super().protocol_send(RawData(data=held))
        await super().protocol_send(event)
