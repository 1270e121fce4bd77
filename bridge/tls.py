"""The bridge's door on the cluster's network (docs/scale-out.md "The bridge across nodes").

On a ``--ray`` run the supervisor listens on the head's cluster address and checks each peer
against the cluster's alive nodes as it accepts it, before a byte is read
(:class:`launcher.cluster.relay.PeerFilter`); it then hands the accepted socket to the bridge
(:meth:`ClusterDoor.adopt`; across the bridge's process boundary as ``SCM_RIGHTS``,
:mod:`bridge.process`), and the bridge serves it itself over TLS with a certificate made for the
run (:func:`run_certificate`), which the node agents pin. The bridge checks route and bearer of
every request as on loopback. Before, the supervisor relayed every byte to the bridge's loopback
listener: a TLS read, a loopback send, a read back and a TLS write of the supervisor's per
model call of a remote rollout (0.17 to 0.23 ms of its CPU per remote item); now none.

The certificate is made here, so its key never leaves the bridge's process: ``openssl`` writes
it to a private temporary directory, it is read into the server context, and the directory is
removed.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from hypercorn.typing import ASGIFramework

    from rollout_server.net.leanserve import LeanConfig

__all__ = ["ClusterDoor", "RunCertificate", "TLSStream", "run_certificate"]


@dataclass(frozen=True)
class RunCertificate:
    """A run's self-signed certificate for ``ip``: the server side, and its PEM to pin."""

    server: ssl.SSLContext
    pem: str


def run_certificate(ip: str) -> RunCertificate | None:
    """A new one-day self-signed certificate (P-256) for the address ``ip``; None when no
    ``openssl`` binary is found. The key is read into the context and its file removed."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    directory = Path(tempfile.mkdtemp(prefix="rollbridge-tls-"))  # mode 0700
    try:
        key, cert = directory / "key.pem", directory / "cert.pem"
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
             "/CN=rollbridge-run", "-addext", f"subjectAltName=IP:{ip}",
             "-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
            timeout=30,
        )  # fmt: skip
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert, key)
        return RunCertificate(server, cert.read_text())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class TLSStream(trio.abc.Stream):
    """The server side of a TLS connection on a non-blocking ``ssl.SSLSocket``.

    Why not ``trio.SSLStream``: it runs the record layer through a ``MemoryBIO`` in Python,
    several calls and a lock per read or write, and served the cluster's model calls for about
    as much of the bridge's CPU as the supervisor's relay used to spend relaying them
    (docs/scale-out.md, "Cost of the replica path"); here each read or write is one call into
    OpenSSL. TLS 1.3 only (both ends are rollbridge's), so there is no renegotiation: a read
    only ever waits to read and a write to write, and the two can wait at once.
    """

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.socket = sock
        self._handshaken = False

    async def _handshake(self) -> None:
        while True:
            try:
                self.socket.do_handshake()
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(self.socket)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(self.socket)
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from None
            else:
                self._handshaken = True
                return

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._handshaken:
            await self._handshake()
        while True:
            try:
                data = self.socket.recv(max_bytes or 65536)
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(self.socket)
            except ssl.SSLZeroReturnError:
                data = b""
                break
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(str(exc)) from None
            else:
                break
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._handshaken:
            await self._handshake()
        view = memoryview(data)
        while view:
            try:
                view = view[self.socket.send(view) :]
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(self.socket)
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(str(exc)) from None
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self.socket)

    async def aclose(self) -> None:
        """Close without a ``close_notify`` (HTTP/1.1 frames every answer by itself); a task
        waiting on the socket gets ``ClosedResourceError``."""
        if self.socket.fileno() >= 0:
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()
        await trio.lowlevel.checkpoint()


class ClusterDoor:
    """Serves the connections handed to the bridge (see the module docstring): over TLS once
    :meth:`start_tls` made the run's certificate, else (no ``openssl``) plain TCP."""

    def __init__(self, app: ASGIFramework, config: LeanConfig, nursery: trio.Nursery) -> None:
        self._app = app
        self._config = config
        self._nursery = nursery
        self._closing = trio.Event()  # never set: the bridge stops by cancellation
        self._tls: ssl.SSLContext | None = None

    async def start_tls(self, host: str) -> str | None:
        """Make the run's certificate for ``host``; its PEM (for the agents to pin), or None
        when no ``openssl`` is found (connections are then served as plain TCP)."""
        cert = await trio.to_thread.run_sync(run_certificate, host)
        if cert is None:
            return None
        cert.server.minimum_version = ssl.TLSVersion.TLSv1_3  # see TLSStream
        self._tls = cert.server
        return cert.pem

    def adopt(self, sock: socket.socket) -> None:
        """Serve ``sock`` (an accepted TCP connection) from now on; it is closed when served."""
        self._nursery.start_soon(self._serve, sock)

    async def _serve(self, sock: socket.socket) -> None:
        from rollout_server.net.leanserve import serve_connection

        if self._tls is None:
            raw = trio.socket.from_stdlib_socket(sock)
            await serve_connection(self._app, self._config, self._closing, trio.SocketStream(raw))
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError:
            sock.close()
            return
        tls.setblocking(False)
        await serve_connection(self._app, self._config, self._closing, TLSStream(tls), tls)
