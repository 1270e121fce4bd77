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

Only servers started with a :class:`CoalescingConfig` behave differently; every other
hypercorn server in the process (it installs a subclass of hypercorn's TCP server for all
of them) keeps hypercorn's own behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import hypercorn.trio.run as _hypercorn_run
import trio
from hypercorn.config import Config
from hypercorn.events import Event, RawData
from hypercorn.trio.tcp_server import TCPServer

__all__ = ["CoalescingConfig"]


class CoalescingConfig(Config):
    """A hypercorn :class:`~hypercorn.config.Config` whose HTTP/1.1 responses leave in one write."""


class _IdleTimer:
    """Closes a keep-alive connection idle for ``timeout`` seconds, or idle at shutdown.

    Stands in for hypercorn's ``TrioSingleTask`` (same ``restart``/``stop`` calls).
    """

    def __init__(
        self, terminated: Any, timeout: float, close: Callable[[], Awaitable[None]]
    ) -> None:
        self._terminated = terminated
        self._timeout = timeout
        self._close = close
        self._idle = False
        self._deadline = math.inf
        self._resumed: trio.Event | None = None
        self._scope: trio.CancelScope | None = None

    async def restart(self, task_group: Any, action: Any) -> None:
        self._idle = True
        self._deadline = trio.current_time() + self._timeout
        if self._scope is None:
            self._scope = trio.CancelScope()
            task_group._nursery.start_soon(self._watch, self._scope)
        elif self._resumed is not None:
            self._resumed.set()

    async def stop(self) -> None:
        self._idle = False

    def cancel(self) -> None:
        """The connection is over: end the watching task."""
        if self._scope is not None:
            self._scope.cancel()

    async def _watch(self, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                if not self._idle:
                    self._resumed = trio.Event()
                    await self._resumed.wait()
                    self._resumed = None
                    continue
                # A request that came and went meanwhile moved the deadline: look again.
                with trio.move_on_at(self._deadline):
                    await self._terminated.wait()
                if self._idle and (
                    self._terminated.is_set() or trio.current_time() >= self._deadline
                ):
                    break
            with trio.CancelScope(shield=True):
                await self._close()


class _CoalescingTCPServer(TCPServer):
    def __init__(self, app: Any, config: Config, *args: Any) -> None:
        super().__init__(app, config, *args)
        self._coalesce = isinstance(config, CoalescingConfig)
        self._in_body = False
        self._held: bytes | None = None
        if self._coalesce:
            self._idle_timer = _IdleTimer(
                self.context.terminated, config.keep_alive_timeout, self._initiate_server_close
            )
            self.idle_task = self._idle_timer  # type: ignore[assignment]

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


if _hypercorn_run.TCPServer is TCPServer:
    _hypercorn_run.TCPServer = _CoalescingTCPServer  # type: ignore[misc]
