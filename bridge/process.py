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
and ``["x", rollout_id]`` (the rollout ended: forget it, and refuse its calls from then on,
bridge.revoke; not urgent, so these are batched: written together (:mod:`bridge.channel`)
once 64 are pending or 0.25 s after the first, and may be overtaken by the others); on a
``--ray`` run, ``["t", host, n]`` (make the run's certificate for the cluster address ``host``:
answered ``["T", n, pem]``, ``pem`` null without ``openssl`` and ``{"error": text}`` when it
failed), ``["h"]`` lines, each with one accepted connection's fd attached (``SCM_RIGHTS``),
which the child serves (:mod:`bridge.tls`), and ``["d", address, n]`` (close every connection
handed over from the peer ``address``, a node that left the cluster: answered ``["T", n,
count]``). The
child sends ``["s", base_url, port]`` once it listens, ``["e", kind, message, detail]`` when
it cannot go on, ``["l", level, message]`` for each (already scrubbed) log line, one
``["u", ...]`` or ``["f", ...]`` per recorded call or provider fault, and one ``["c", record]``
per finished call (its record, :mod:`bridge.calls`), sent right after its usage.

The ordering guarantee the dispatcher relies on — a rollout's usage is known when its result
arrives — holds across the hop: the child writes a call's usage line synchronously, before
the answer to that call is written (:class:`bridge.usage.UsageObserver`), so it is in the
socket before the rollout can have seen its answer, let alone reported its result; and every
read of the mirror (:meth:`MirrorLedger.pop` and the rest) first drains what the socket holds.

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
import struct
import subprocess
from collections import deque
from collections.abc import Callable, Container
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import trio

from bridge.calls import CallBook
from bridge.channel import Channel, MirrorLedger
from bridge.errors import BridgeBindError, BridgeProcessError
from bridge.ipc import config_message
from bridge.probe import ProbeKey
from bridge.scrub import ErrorScrubber
from bridge.server import BridgeConfig, rollout_url
from bridge.spare import STOP_GRACE_S, BridgeSpare, wait_exit

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["BridgeProcessHandle", "run_bridge_process"]

#: Lines of the child's stderr kept for the error that reports its death.
_TAIL: Final = 20


class BridgeProcessHandle:
    """A bridge running in its own process, as the supervisor sees it
    (:class:`bridge.server.BridgeService`)."""

    def __init__(
        self,
        base_url: str,
        port: int,
        pid: int,
        channel: Channel,
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
    def ledger(self) -> MirrorLedger:
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

    async def start_tls(self, host: str) -> str | None:
        """Have the child make the run's certificate for the cluster address ``host``
        (:mod:`bridge.tls`; its key stays in the child); the PEM to pin, or None (no
        ``openssl``: connections handed over are served as plain TCP). Raises
        :class:`BridgeProcessError` when ``openssl`` is there but fails."""
        pem = await self._channel.ask("t", host)
        if isinstance(pem, dict):
            raise BridgeProcessError(f"could not make the run's TLS certificate: {pem['error']}")
        return pem if isinstance(pem, str) else None

    async def cut(self, address: str) -> int:
        """Close every connection handed over from the peer ``address`` (a node that left the
        cluster; bridge.tls); return, once they are closed, how many were open."""
        count = await self._channel.ask("d", address)
        return count if isinstance(count, int) else 0

    async def adopt(self, sock: socket.socket, still_allowed: Container[str] = ()) -> None:
        """Hand the accepted connection ``sock`` (its peer checked) to the child, which serves
        it (over TLS after :meth:`start_tls`); this process's copy is closed. With
        ``still_allowed``, the peer is checked against it again right as it is handed over
        (it may have left meanwhile, and :meth:`cut` been sent): a peer no longer in it is
        reset instead."""
        try:
            peer = str(sock.getpeername()[0])
        except OSError:  # reset meanwhile
            sock.close()
            return

        def allowed() -> bool:
            return not still_allowed or peer in still_allowed

        try:
            if not await self._channel.send_fd(sock.fileno(), allowed):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            sock.close()

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


def _exit_reason(code: int, channel: Channel, tail: deque[str]) -> str:
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
        channel = Channel(sock, config.log)
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
