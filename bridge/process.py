"""The bridge in a process of its own: :func:`run_bridge_process` and its handle.

Why: in the supervisor's process the bridge's HTTP work shares one GIL with the rollout
client, the dispatcher and the run directory; at a few hundred calls a second that one core is
the run's ceiling while the second core idles. In its own process the bridge gets that core,
and the supervisor keeps only a mirror of the usage ledger.

How the two talk: one ``AF_UNIX`` stream socket pair, a JSON array per line
(:mod:`bridge.ipc`). The child is ``python -m bridge.child <fd>``; the supervisor sends it its
configuration as the first line (the bearer, the probe key and the redactor's values travel
only over this private socket: never on a command line, in the environment or in a file), and
then ``["k", on]`` (keepalive mode), ``["p", n]`` (answered ``["P", n]`` once everything
sent before it is applied; ``["r", rollout_id, n]``, a revoke, once its calls in flight ended)
and ``["x", rollout_id]`` (forget a rollout; not urgent, so forgets are batched: written
together once :data:`_FORGET_BATCH` are pending or :data:`_FORGET_DELAY_S` after the first,
and may be overtaken by the others). The child sends ``["s", base_url, port]`` once it
listens, ``["e", kind, message, detail]`` when it cannot go on, ``["l", level, message]`` for
each (already scrubbed) log line, and one ``["u", ...]`` or ``["f", ...]`` per recorded call
or provider fault, and one ``["c", record]`` per finished call (its record,
:mod:`bridge.calls`), sent right after its usage.

The ordering guarantee the dispatcher relies on — a rollout's usage is known when its result
arrives — holds across the hop: the child writes a call's usage line synchronously, before
the answer to that call is written (:class:`bridge.usage.UsageObserver`), so it is in the
socket before the rollout can have seen its answer, let alone reported its result; and every
read of the mirror (:meth:`_MirrorLedger.pop` and the rest) first drains what the socket holds.

Lifetime: the child runs in a session of its own (a terminal Ctrl-C reaches only the
supervisor, which decides when the bridge stops) and stops when its end of the socket reads
EOF: when the supervisor closes it on the way out, or when the supervisor dies (``kill -9``
included), so a bridge never outlives its run. A child that exits while the run goes on is
reported by :meth:`BridgeProcessHandle.wait_failed`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import trio

from bridge.calls import CallBook
from bridge.errors import BridgeBindError, BridgeProcessError
from bridge.ipc import config_message, encode_line, split_lines
from bridge.probe import ProbeKey
from bridge.scrub import ErrorScrubber
from bridge.server import BridgeConfig, rollout_url
from bridge.spare import STOP_GRACE_S, BridgeSpare, wait_exit
from bridge.usage import CallUsage, RolloutUsage, UpstreamPressure, UsageLedger

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["BridgeProcessHandle", "run_bridge_process"]

#: Bytes read from the socket at a time.
_CHUNK: Final = 1 << 18
#: Lines of the child's stderr kept for the error that reports its death.
_TAIL: Final = 20
#: Forget messages held back to go out in one write, at most this many ...
_FORGET_BATCH: Final = 64
#: ... and for at most this long after the first of them (seconds).
_FORGET_DELAY_S: Final = 0.25


class _Channel:
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
        self.ledger = _MirrorLedger(self)
        self.calls = CallBook(before_read=self.drain)
        self._pings: dict[int, trio.Event] = {}
        self._ping_ids = 0

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
        elif kind == "P":
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
        self._ping_ids += 1
        waiter = self._pings[self._ping_ids] = trio.Event()
        self.send([kind, *args, self._ping_ids])
        if self.eof:
            return
        await waiter.wait()

    async def follow(self) -> None:
        """Apply the child's messages as they come, until EOF."""
        while not self.eof:
            await trio.lowlevel.wait_readable(self.sock)
            self.drain()


class _MirrorLedger(UsageLedger):
    """The supervisor's copy of the child's usage ledger: every read drains the socket first,
    so it holds every call whose answer has left the child; forgetting a rollout tells the child
    to forget it too (its reasoning memory)."""

    def __init__(self, channel: _Channel) -> None:
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


class BridgeProcessHandle:
    """A bridge running in its own process, as the supervisor sees it
    (:class:`bridge.server.BridgeService`)."""

    def __init__(
        self,
        base_url: str,
        port: int,
        pid: int,
        channel: _Channel,
        probe: ProbeKey,
        keepalive: bool,
    ) -> None:
        self.pid = pid
        """The child's process id."""
        self._base_url = base_url
        self._port = port
        self._channel = channel
        self._probe = probe
        self._keepalive = keepalive
        self._failed = trio.Event()
        self._failure = ""

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash."""
        return self._base_url

    @property
    def port(self) -> int:
        return self._port

    @property
    def ledger(self) -> _MirrorLedger:
        """Usage per rollout id, as the child reported it."""
        return self._channel.ledger

    @property
    def calls(self) -> CallBook:
        """Call records per rollout id, as the child reported them (each read drains first)."""
        return self._channel.calls

    @property
    def keepalive(self) -> bool:
        """Whether keepalive mode (public URL) is on; setting it applies to requests from now."""
        return self._keepalive

    @keepalive.setter
    def keepalive(self, on: bool) -> None:
        if on != self._keepalive:
            self._keepalive = on
            self._channel.send(["k", on])

    async def settled(self) -> None:
        """Return once the child applies every setting made so far (keepalive crosses the
        socket asynchronously: the supervisor waits for this before the first dispatch)."""
        await self._channel.ping()

    async def revoke(self, rollout_id: str) -> None:
        """Refuse ``rollout_id``'s calls from now on (bridge.revoke), its calls in flight ended."""
        await self._channel.ping("r", rollout_id)

    def probe_answer(self, nonce: str) -> str:
        """What the bridge answers a sandbox probe of ``nonce`` with (bridge.probe)."""
        return self._probe.answer(nonce)

    def rollout_url(self, rollout_id: str, base: str | None = None) -> str:
        """:func:`bridge.server.rollout_url` for ``rollout_id`` at ``base`` (default loopback)."""
        return rollout_url(base or self._base_url, rollout_id)

    async def wait_failed(self) -> str:
        """Return, with a one-line reason, once the child has exited while not being stopped."""
        await self._failed.wait()
        return self._failure

    def _fail(self, reason: str) -> None:
        self._failure = reason
        self._failed.set()


async def _pump_stderr(
    stream: trio.abc.ReceiveStream,
    tail: deque[str],
    log: Callable[[str, str], None] | None,
    redact: Callable[[str], str],
    done: trio.Event,
) -> None:
    """Log the child's stderr (a warning or a traceback: it writes nothing else there), each
    line through ``redact`` first: unlike its log lines, the child has not scrubbed these.
    ``done`` is set at EOF."""
    buffer = b""
    try:
        async for chunk in stream:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = redact(raw.decode("utf-8", errors="replace").rstrip())
                if line:
                    tail.append(line)
                    if log is not None:
                        log("warning", f"bridge process: {line}")
        if buffer.strip():
            tail.append(redact(buffer.decode("utf-8", errors="replace").rstrip()))
    finally:
        done.set()


def _exit_reason(code: int, channel: _Channel, tail: deque[str]) -> str:
    if channel.error is not None:
        return f"the LLM bridge process failed: {channel.error[1]}"
    last = next((line for line in reversed(tail) if line.strip()), "")
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"the LLM bridge process {how}" + (f" ({last})" if last else "")


async def run_bridge_process(
    config: BridgeConfig,
    *,
    spare: BridgeSpare | None = None,
    redact_values: Iterable[str] = (),
    task_status: trio.TaskStatus[BridgeProcessHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``config``'s bridge from a child process until cancelled (use with
    ``nursery.start``, which returns the handle once the child listens).

    ``spare``: a :class:`BridgeSpare` started earlier (else the one started
    :meth:`~BridgeSpare.ahead`, else a new one). The child
    serves with this process's environment as it is now (secrets scoped in included).
    ``redact_values`` are the run's secret values (a redactor's patterns, each matched exactly as
    given); the child masks them in every error message and log line, as ``config.redact`` does
    in process (``config.redact`` itself, a callable, cannot cross). Raises
    :class:`BridgeBindError` when the port cannot be bound and :class:`BridgeProcessError` when
    the child does not start.
    """
    probe_key = config.probe_key or secrets.token_bytes(32)
    config = replace(config, probe_key=probe_key)
    if spare is None or spare.taken or spare.process.poll() is not None:
        spare = BridgeSpare.take()
    spare.taken = True
    process, sock = spare.process, spare.sock
    assert process.stderr is not None
    stderr = trio.lowlevel.FdStream(os.dup(process.stderr.fileno()))
    process.stderr.close()
    stderr_done = trio.Event()
    tail: deque[str] = deque(maxlen=_TAIL)
    failure: Exception | None = None
    try:
        sock.setblocking(False)
        channel = _Channel(sock, config.log)
        message = config_message(config, redact_values, os.environb)
        channel.send(message)  # what the socket does not take now, the flush task writes
        redact = ErrorScrubber([config.token], extra=config.redact).scrub

        async def exit_reason() -> str:
            code = await wait_exit(process)
            with trio.move_on_after(1.0):  # its last stderr lines say why, when it crashed
                await stderr_done.wait()
            return _exit_reason(code, channel, tail)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump_stderr, stderr, tail, config.log, redact, stderr_done)
            nursery.start_soon(channel.flush)
            while channel.started is None and not channel.eof:
                await trio.lowlevel.wait_readable(sock)
                channel.drain()
            if channel.started is None:
                if channel.error is not None and channel.error[0] == "bind":
                    failure = BridgeBindError(channel.error[1])
                else:
                    failure = BridgeProcessError(await exit_reason())
                nursery.cancel_scope.cancel()
            else:
                base_url, port = channel.started
                handle = BridgeProcessHandle(
                    base_url, port, process.pid, channel, ProbeKey(probe_key), config.keepalive
                )
                task_status.started(handle)
                await channel.follow()
                handle._fail(await exit_reason())
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure  # out here, not wrapped in the nursery's exception group
    finally:
        with trio.CancelScope(shield=True):
            await _stop(sock, process)
            await stderr.aclose()
            sock.close()


async def _stop(sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
    """Close our end (the child's cue to stop), give it :data:`STOP_GRACE_S`, then kill it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    with trio.move_on_after(STOP_GRACE_S):
        await wait_exit(process)
    if process.poll() is None:
        process.kill()
        await wait_exit(process)
