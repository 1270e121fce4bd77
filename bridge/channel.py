"""The supervisor's end of the socket to the bridge's own process (the protocol is described
in :mod:`bridge.process`): :class:`Channel` applies the child's messages and sends the
supervisor's, and :class:`MirrorLedger` is the supervisor's copy of the child's usage ledger.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Final

import trio

from bridge.calls import CallBook
from bridge.ipc import encode_line, split_lines
from bridge.usage import CallUsage, RolloutUsage, UpstreamPressure, UsageLedger

__all__ = ["Channel", "MirrorLedger"]

#: Bytes read from the socket at a time.
_CHUNK: Final = 1 << 18
#: How often a connection waiting to be handed over looks at a full socket again (seconds).
_FD_RETRY_S: Final = 0.002
#: Forget messages held back to go out in one write, at most this many ...
_FORGET_BATCH: Final = 64
#: ... and for at most this long after the first of them (seconds).
_FORGET_DELAY_S: Final = 0.25


class Channel:
    """The supervisor's end of the socket: a drain that applies the child's messages,
    non-blocking sends with a backlog a writer task flushes, and messages that can wait
    (:meth:`send_later`), which that task writes in batches."""

    def __init__(self, sock: socket.socket, log: Callable[[str, str], None] | None) -> None:
        self.sock = sock
        self._log = log
        self._buffer = bytearray()
        self._backlog = bytearray()
        self._backlog_ready = trio.Event()
        self._later = bytearray()
        self._later_count = 0
        self._later_due = 0.0
        self.eof = False
        self.started: tuple[str, int] | None = None
        self.error: tuple[str, str] | None = None
        self.ledger = MirrorLedger(self)
        self.calls = CallBook(before_read=self.drain)
        self._pings: dict[int, trio.Event] = {}
        self._ping_ids = 0
        self._answers: dict[int, Any] = {}

    def drain(self) -> None:
        """Read and apply everything the socket holds now (never blocks)."""
        while not self.eof:
            try:
                data = self.sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                for waiter in self._pings.values():
                    waiter.set()  # nothing more will be answered
                break
            self._buffer += data
            if len(data) < _CHUNK:
                break
        if self._buffer:
            for message in split_lines(self._buffer):
                self._apply(message)

    def _apply(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == "u":
            _, rollout_id, prompt, completion, total, cached, reasoning, *rest = message
            cache_write = rest[0] if rest else None  # absent from an older child
            self.ledger.apply_record(
                rollout_id, CallUsage(prompt, completion, total, cached, reasoning, cache_write)
            )
        elif kind == "c":
            self.calls.add(message[1])
        elif kind == "f":
            self.ledger.apply_fault(message[1], message[2], retried=message[3])
        elif kind == "l":
            if self._log is not None:
                self._log(message[1], message[2])
        elif kind in ("P", "T"):  # "T" carries a value (Channel.ask)
            if kind == "T":
                self._answers[message[1]] = message[2]
            waiter = self._pings.pop(message[1], None)
            if waiter is not None:
                waiter.set()
        elif kind == "s":
            self.started = (message[1], message[2])
        elif kind == "e":
            self.error = (message[1], message[2])
            if self._log is not None and message[3]:
                self._log("error", message[3])

    def send(self, message: list[Any]) -> None:
        """Send ``message`` now if the socket takes it, else queue it for :meth:`flush`."""
        self._send(encode_line(message))

    def send_later(self, message: list[Any]) -> None:
        """Send ``message`` with others that can wait: once :data:`_FORGET_BATCH` are held,
        else :data:`_FORGET_DELAY_S` after the first (by :meth:`flush`). Messages sent with
        :meth:`send` meanwhile may overtake it."""
        if self.eof:
            return
        self._later += encode_line(message)
        self._later_count += 1
        if self._later_count >= _FORGET_BATCH:
            self._send(self._take_later())
        elif self._later_count == 1:
            self._later_due = trio.current_time() + _FORGET_DELAY_S
            self._backlog_ready.set()  # the writer task starts the clock

    def _take_later(self) -> bytes:
        data = bytes(self._later)
        self._later.clear()
        self._later_count = 0
        return data

    def _send(self, data: bytes) -> None:
        if self.eof:
            return
        if not self._backlog:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return  # the child is gone; wait_failed reports it
            data = data[sent:]
        if data:
            self._backlog += data
            self._backlog_ready.set()

    async def flush(self) -> None:
        """Write queued messages as the socket drains, and the held-back ones when due (runs
        until cancelled)."""
        while True:
            if self._later_count:
                with trio.move_on_at(self._later_due):
                    await self._backlog_ready.wait()
            else:
                await self._backlog_ready.wait()
            if self._later_count and (self._backlog or trio.current_time() >= self._later_due):
                self._send(self._take_later())
            while self._backlog:
                await trio.lowlevel.wait_writable(self.sock)
                try:
                    sent = self.sock.send(self._backlog)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    self._backlog.clear()
                    break
                del self._backlog[:sent]
            self._backlog_ready = trio.Event()

    async def ping(self, kind: str = "p", *args: Any) -> None:
        """Return once the child has applied every message sent before this one (forgets held
        by :meth:`send_later` excepted), or has answered ``[kind, *args, n]`` (a revoke)."""
        await self.ask(kind, *args)

    async def ask(self, kind: str, *args: Any) -> Any:
        """Send ``[kind, *args, n]``; once the child answers ``["P", n]`` or ``["T", n, value]``
        (or is gone), the value (None for the others)."""
        self._ping_ids += 1
        ask = self._ping_ids
        waiter = self._pings[ask] = trio.Event()
        self.send([kind, *args, ask])
        if not self.eof:
            await waiter.wait()
        return self._answers.pop(ask, None)

    async def send_fd(self, fd: int, allowed: Callable[[], bool] = lambda: True) -> bool:
        """Hand the connection ``fd`` to the child: an ``["h"]`` line with ``fd`` attached
        (``SCM_RIGHTS``), sent as a line of its own once no other line is part-sent. False
        when ``allowed()``, asked right before the line is written (so a message sent
        before that is applied before it), said no; True otherwise."""
        line = encode_line(["h"])
        while not self.eof:
            if not self._backlog:
                if not allowed():
                    return False
                try:
                    sent = socket.send_fds(self.sock, [line], [fd])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    return True  # the child is gone; wait_failed reports it
                else:
                    if sent < len(line):  # the fd went with the first byte
                        self._backlog += line[sent:]
                        self._backlog_ready.set()
                    return True
            # The socket is full (rare: one line per connection): the flush task drains it.
            await trio.sleep(_FD_RETRY_S)
        return True

    async def follow(self) -> None:
        """Apply the child's messages as they come, until EOF."""
        while not self.eof:
            await trio.lowlevel.wait_readable(self.sock)
            self.drain()


class MirrorLedger(UsageLedger):
    """The supervisor's copy of the child's usage ledger: every read drains the socket first,
    so it holds every call whose answer has left the child; forgetting a rollout tells the child
    to forget it too (its reasoning memory)."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(on_forget=lambda rollout_id: channel.send_later(["x", rollout_id]))
        self._channel = channel

    def apply_record(self, rollout_id: str, call: CallUsage) -> None:
        super().record(rollout_id, call)

    def apply_fault(self, rollout_id: str, status: int, *, retried: bool) -> None:
        super().fault(rollout_id, status, retried=retried)

    def pop(self, rollout_id: str) -> RolloutUsage | None:
        self._channel.drain()
        return super().pop(rollout_id)

    def get(self, rollout_id: str) -> RolloutUsage | None:
        self._channel.drain()
        return super().get(rollout_id)

    def snapshot(self) -> dict[str, RolloutUsage]:
        self._channel.drain()
        return super().snapshot()

    def pressure(self) -> UpstreamPressure:
        self._channel.drain()
        return super().pressure()
