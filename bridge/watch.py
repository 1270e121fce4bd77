"""Cancelling a chat call whose client went away (docs/spec/bridge.md §8), watched lazily.

Noticing a vanished client takes a task that waits on the client's connection while the
handler waits on the provider: a task started and cancelled per call, with its socket
registration, was a quarter of the bridge's CPU per call on a fast provider. A call that ends
within :data:`WATCH_AFTER` has little left to stop, so it gets no such task: one sweeper task
per bridge starts a watch for each call still running that long (so a call whose client left
is cancelled within about twice that), and the call's end stops its watch, if it has one,
before the connection is read again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

if TYPE_CHECKING:
    from rollout_server.net.asgi import ASGIReceiveCallable

__all__ = ["WATCH_AFTER", "DisconnectWatch", "WatchedCall"]

WATCH_AFTER: Final = 1.0
"""Seconds a call runs before its client's connection is watched."""


class WatchedCall:
    """One call in progress: cancelling :attr:`scope` stops it."""

    __slots__ = ("done", "receive", "scope", "started", "stop")

    def __init__(self, receive: ASGIReceiveCallable, started: float) -> None:
        self.receive = receive
        self.started = started
        self.scope = trio.CancelScope()
        """The call runs inside it; the watch cancels it when the client goes away."""
        self.stop: trio.CancelScope | None = None
        """The watch's own scope, once a watch is started."""
        self.done: trio.Event | None = None
        """Set when the watch has ended, once a watch is started."""


class DisconnectWatch:
    """Starts the watch of every call that has run for ``after`` seconds, in ``nursery``."""

    def __init__(self, nursery: trio.Nursery, after: float = WATCH_AFTER) -> None:
        self._nursery = nursery
        self._after = after
        # Calls not watched yet, in the order they began (a dict keeps insertion order).
        self._pending: dict[WatchedCall, None] = {}
        self._wake: trio.Event | None = None
        self._sweeping = False

    def begin(self, receive: ASGIReceiveCallable) -> WatchedCall:
        """A call starts; run it inside the returned call's :attr:`~WatchedCall.scope`, and
        :meth:`end` it whatever happens."""
        call = WatchedCall(receive, trio.current_time())
        self._pending[call] = None
        if not self._sweeping:
            self._sweeping = True
            self._nursery.start_soon(self._sweep)
        elif self._wake is not None:
            self._wake.set()
        return call

    async def run(
        self, receive: ASGIReceiveCallable, answer: Callable[[], Awaitable[None]]
    ) -> None:
        """Run ``answer()`` as one call: cancelled if its client goes away, ended whatever
        happens (:meth:`begin`, then :meth:`end`)."""
        call = self.begin(receive)
        try:
            with call.scope:
                await answer()
        finally:
            await self.end(call)

    async def end(self, call: WatchedCall) -> None:
        """The call is over: forget it, or stop its watch and wait until that has let go of
        the connection (it consumes nothing when stopped)."""
        if call.done is None:
            del self._pending[call]
            return
        assert call.stop is not None
        call.stop.cancel()
        with trio.CancelScope(shield=True):
            await call.done.wait()

    async def _sweep(self) -> None:
        pending = self._pending
        while True:
            if not pending:
                self._wake = trio.Event()
                await self._wake.wait()
                self._wake = None
                continue
            oldest = next(iter(pending))
            await trio.sleep_until(oldest.started + self._after)
            now = trio.current_time()
            while pending:
                call = next(iter(pending))
                # The same sum as the deadline slept until, so the call it was for is due.
                if call.started + self._after > now:
                    break
                del pending[call]
                call.stop = trio.CancelScope()
                call.done = trio.Event()
                self._nursery.start_soon(_watch, call)


async def _watch(call: WatchedCall) -> None:
    assert call.stop is not None and call.done is not None
    try:
        with call.stop:
            try:
                while (await call.receive())["type"] != "http.disconnect":
                    pass
            except Exception:
                pass  # a connection that cannot be read has lost its client too
            call.scope.cancel()
    finally:
        call.done.set()
