"""``python -m bridge.child <fd>``: the bridge's own process, started by
:func:`bridge.process.run_bridge_process` (the socket protocol is described there).

It reads its configuration from the socket ``<fd>``, serves the bridge, reports each call's
usage on the socket before the call's answer is written, and stops when the socket reads EOF.
SIGINT is ignored: the supervisor, not the terminal, decides when the bridge stops.
"""

from __future__ import annotations

import gc
import importlib
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from bridge.errors import BridgeBindError
from bridge.ipc import encode_line, read_config, split_lines
from bridge.server import WEB_STACK, BridgeConfig, BridgeHandle, run_bridge
from bridge.usage import CallUsage
from rollout_server.net.secrets import REDACTED, SecretMatcher

__all__ = ["main"]

#: Connections' fds taken in one read of the socket (each comes with its own line).
_MAX_FDS = 64

_GC_YOUNG_THRESHOLD = 50_000
"""Allocations between young-generation collections (Python's default is 700): at thousands of
calls in flight a call's objects outlive 700 allocations of other calls, so the collector walked
and promoted them before they were freed anyway (as in the rollout server, serve())."""


class _Reporter:
    """The child's sends: blocking (a full socket waits for the supervisor to read), from
    whichever thread records usage (the LiteLLM thread does)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.gone = False

    def send(self, message: list[Any]) -> None:
        data = memoryview(encode_line(message))
        with self._lock:
            while data and not self.gone:
                try:
                    data = data[self._sock.send(data) :]
                except (BlockingIOError, InterruptedError):
                    poller = select.poll()  # not select(): the fd may be above FD_SETSIZE
                    poller.register(self._sock, select.POLLOUT)
                    poller.poll()
                except OSError:
                    self.gone = True  # the supervisor is gone: the reader sees EOF and stops

    def recorded(self, rollout_id: str, call: CallUsage) -> None:
        self.send(
            [
                "u",
                rollout_id,
                call.prompt_tokens,
                call.completion_tokens,
                call.total_tokens,
                call.cached_tokens,
                call.reasoning_tokens,
                call.cache_write_tokens,
            ]
        )

    def called(self, record: dict[str, Any]) -> None:
        self.send(["c", record])

    def faulted(self, rollout_id: str, status: int, retried: bool) -> None:
        self.send(["f", rollout_id, status, retried])

    def log(self, level: str, message: str) -> None:
        self.send(["l", level, message])


def _read_config(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    """The first message (blocking), and whatever arrived after it."""
    buffer = bytearray()
    while b"\n" not in buffer:
        data = sock.recv(1 << 16)
        if not data:
            raise EOFError("the supervisor closed the socket before sending a configuration")
        buffer += data
    end = buffer.index(b"\n") + 1
    (first,) = split_lines(bytearray(buffer[:end]))
    del buffer[:end]
    kind, doc = first
    if kind != "c" or not isinstance(doc, dict):
        raise ValueError("the first message is not a configuration")
    return doc, buffer


def _redactor(values: list[str]) -> Callable[[str], str]:
    matcher = SecretMatcher()
    for value in values:
        # Exactly the values given: a stripped form is in the list when the sender kept it.
        matcher.add(value, min_length=len(value))

    def redact(text: str) -> str:
        return matcher.sub(REDACTED, text)

    return redact


async def _settled(handle: BridgeHandle, reporter: _Reporter, rollout_id: str, ping: int) -> None:
    await handle.revocations.settled(rollout_id)
    reporter.send(["P", ping])  # after the usage of the calls it cancelled


async def _start_tls(handle: BridgeHandle, reporter: _Reporter, host: str, ping: int) -> None:
    answer: str | dict[str, str] | None
    try:
        answer = await handle.start_tls(host)
    except (OSError, subprocess.SubprocessError, ssl.SSLError) as exc:
        # Told as a failure, never as "no openssl": that would fall back to plain TCP.
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    reporter.send(["T", ping, answer])


async def _cut(handle: BridgeHandle, reporter: _Reporter, address: str, ping: int) -> None:
    reporter.send(["T", ping, await handle.cut(address)])


async def _follow(
    sock: socket.socket,
    handle: BridgeHandle,
    reporter: _Reporter,
    buffer: bytearray,
    nursery: trio.Nursery,
) -> None:
    """Apply the supervisor's messages until EOF."""
    fds: deque[int] = deque()  # handed-over connections, in the order their "h" lines come
    try:
        await _apply(sock, handle, reporter, buffer, nursery, fds)
    finally:
        for fd in fds:
            os.close(fd)


async def _apply(
    sock: socket.socket,
    handle: BridgeHandle,
    reporter: _Reporter,
    buffer: bytearray,
    nursery: trio.Nursery,
    fds: deque[int],
) -> None:
    while True:
        for message in split_lines(buffer):
            if message[0] == "h":
                # A connection accepted on the cluster address (its fd came with this line's
                # first byte, so it is here by now), its peer checked by the supervisor.
                if fds:
                    await handle.adopt(socket.socket(fileno=fds.popleft()))
            elif message[0] == "t":
                nursery.start_soon(_start_tls, handle, reporter, message[1], message[2])
            elif message[0] == "k":
                handle.keepalive = bool(message[1])
            elif message[0] == "x":
                # The rollout ended (its usage taken, or its attempt given up): its calls are
                # refused from now on (bridge.revoke, "Ended rollouts").
                handle.ledger.discard(message[1])
                handle.revocations.finish(message[1])
            elif message[0] == "p":
                reporter.send(["P", message[1]])
            elif message[0] == "d":
                # Answered once that peer's connections are closed; meanwhile others apply.
                nursery.start_soon(_cut, handle, reporter, message[1], message[2])
            elif message[0] == "r":
                # Refused from this message on; answered once its calls in flight have ended.
                handle.revocations.revoke(message[1])
                nursery.start_soon(_settled, handle, reporter, message[1], message[2])
        await trio.lowlevel.wait_readable(sock)
        try:
            data, received, flags, _ = socket.recv_fds(sock, 1 << 16, _MAX_FDS)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return
        fds.extend(received)
        if flags & socket.MSG_CTRUNC:  # more fds than _MAX_FDS in one read: never in practice
            reporter.log("warning", "connections handed to the bridge were lost (MSG_CTRUNC)")
        if not data:
            return
        buffer += data


async def _serve(
    config: BridgeConfig, sock: socket.socket, reporter: _Reporter, buffer: bytearray
) -> None:
    async with trio.open_nursery() as nursery:
        handle: BridgeHandle = await nursery.start(run_bridge, config)
        reporter.send(["s", handle.base_url, handle.port])
        gc.collect()
        gc.freeze()  # what start-up allocated is never collected: later collections skip it
        gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        await _follow(sock, handle, reporter, buffer, nursery)
        nursery.cancel_scope.cancel()


def main(argv: list[str]) -> int:
    """Serve the bridge configured over the socket ``argv[0]``; the exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m bridge.child FD (started by the supervisor)", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    reporter = _Reporter(sock)
    redact: Callable[[str], str] = str
    try:
        # Import the web stack before the configuration arrives: a spare (bridge.process)
        # does this while the supervisor prepares the run.
        for module in WEB_STACK:
            importlib.import_module(module)
        try:
            doc, buffer = _read_config(sock)
        except EOFError:
            return 0  # a spare the supervisor did not need
        fields, values, environ = read_config(doc)
        redact = _redactor(values or [fields["token"]])
        os.environb.clear()
        os.environb.update(environ)
        config = BridgeConfig(
            **fields,
            redact=redact,
            log=reporter.log,
            usage_observer=reporter,
            call_observer=reporter,
        )
        sock.setblocking(False)
        trio.run(_serve, config, sock, reporter, buffer)
    except Exception as exc:
        leaf = _leaf(exc)
        if isinstance(leaf, BridgeBindError):
            reporter.send(["e", "bind", redact(str(leaf)), ""])
        else:
            summary = redact(f"{type(leaf).__name__}: {leaf}".splitlines()[0])
            reporter.send(["e", "crash", summary, redact(traceback.format_exc())])
        return 1
    return 0


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (trio's strict groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
