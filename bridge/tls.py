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

A node that leaves the cluster is dropped from the supervisor's allow-list, and its connections
already handed over are closed (:meth:`ClusterDoor.cut`, the supervisor's ``["d", address]``):
its attempts were requeued and revoked all the same, but a node gone from the cluster keeps no
open way to the bridge.

The certificate is made here, so its key never leaves the bridge's process: ``openssl`` writes
it to a private temporary directory, it is read into the server context, and the directory is
removed.
"""

from __future__ import annotations

import ipaddress
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

__all__ = ["ClusterDoor", "RunCertificate", "peer_address", "run_certificate"]

#: How long :meth:`ClusterDoor.cut` waits for the connections it cancelled to close (seconds).
_CUT_WAIT_S = 5.0


def peer_address(address: str) -> str:
    """One spelling per address (``::ffff:10.0.0.2`` is ``10.0.0.2``); a name stays as is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


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
        # No TLS 1.3 session tickets: the agents' relays never resume a session (trio's
        # SSLStream takes none), so the two tickets sent after every handshake were wasted work
        # (the server's handshake: 0.41 against 0.48 ms of CPU here).
        server.num_tickets = 0
        return RunCertificate(server, cert.read_text())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class ClusterDoor:
    """Serves the connections handed to the bridge (see the module docstring): over TLS once
    :meth:`start_tls` made the run's certificate, else (no ``openssl``) plain TCP."""

    def __init__(self, app: ASGIFramework, config: LeanConfig, nursery: trio.Nursery) -> None:
        self._app = app
        self._config = config
        self._nursery = nursery
        self._closing = trio.Event()  # never set: the bridge stops by cancellation
        self._tls: ssl.SSLContext | None = None
        # Peer address -> the cancel scopes of its connections being served (for cut()).
        self._peers: dict[str, set[trio.CancelScope]] = {}
        self._closed: dict[str, trio.Event] = {}  # set once a cut peer has none left

    async def start_tls(self, host: str) -> str | None:
        """Make the run's certificate for ``host``; its PEM (for the agents to pin), or None
        when no ``openssl`` is found (connections are then served as plain TCP)."""
        cert = await trio.to_thread.run_sync(run_certificate, host)
        if cert is None:
            return None
        self._tls = cert.server
        return cert.pem

    def adopt(self, sock: socket.socket) -> None:
        """Serve ``sock`` (an accepted TCP connection) from now on; it is closed when served."""
        try:
            peer = peer_address(sock.getpeername()[0])
        except OSError:  # reset before it was handed over
            sock.close()
            return
        self._nursery.start_soon(self._serve, sock, peer)

    async def cut(self, address: str) -> int:
        """Close every connection from the peer ``address`` (requests on them are cut short,
        as if the peer had gone); return, once they are closed, how many there were."""
        peer = peer_address(address)
        scopes = self._peers.get(peer, set())
        count = len(scopes)
        for scope in scopes:
            scope.cancel()
        if count:
            closed = self._closed.setdefault(peer, trio.Event())
            with trio.move_on_after(_CUT_WAIT_S):
                await closed.wait()
        await trio.lowlevel.checkpoint()
        return count

    async def _serve(self, sock: socket.socket, peer: str) -> None:
        scopes = self._peers.setdefault(peer, set())
        with trio.CancelScope() as scope:
            scopes.add(scope)
            try:
                await self._serve_one(sock)
            finally:
                sock.close()
                scopes.discard(scope)
                if not scopes:
                    del self._peers[peer]
                    closed = self._closed.pop(peer, None)
                    if closed is not None:
                        closed.set()

    async def _serve_one(self, sock: socket.socket) -> None:
        from rollout_server.net.leanserve import serve_connection

        raw = trio.socket.from_stdlib_socket(sock)
        stream: trio.abc.Stream = trio.SocketStream(raw)
        if self._tls is not None:
            # trio's SSLStream, not a hand-written stream on a non-blocking ssl.SSLSocket: that
            # one measured 20.7 against 31.2 us of server CPU per exchange (commit 538c38f,
            # scripts/bench/bench_tls_door.py), about 0.003 ms per item in bench_ray: too little.
            # https_compatible: closing does not wait for a handshake or send close_notify
            # (an idle close of a peer that never handshakes would wait forever otherwise).
            stream = trio.SSLStream(stream, self._tls, server_side=True, https_compatible=True)
        await serve_connection(self._app, self._config, self._closing, stream, raw)
