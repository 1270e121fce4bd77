"""The bridge's path across nodes: the node agents' relays and the head's door.

Each node agent serves a relay (:func:`relay_to`) on its own loopback to the bridge's door on
the head's cluster address, so a rollout on any node keeps a loopback ``chat_completions_url``.
The hop over the cluster network is TLS with a certificate the bridge made for the run
(:func:`bridge.tls.run_certificate`): the agents trust that one certificate and nothing else
(:func:`pinned_client`; it reaches them as an actor argument), and its key never leaves the
bridge's process. The relays read nothing: the bridge checks the route and the per-run bearer
of every request itself.

The door (:func:`serve_relay` with the bridge's ``adopt`` as handler, launcher.cluster.run)
accepts connections only from the addresses of :class:`AllowedPeers`: loopback, the head's own
address, and the cluster's alive nodes as the replica manager's last poll of the node list saw
them. Any other peer is reset as it is accepted, before the TLS handshake and before a byte is
read; an allowed one is handed to the bridge, which serves it (TLS included) itself.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

import trio

from bridge.tls import peer_address
from rollout_server.net.hosts import is_loopback_host

__all__ = [
    "AllowedPeers",
    "PeerFilter",
    "pinned_client",
    "pump",
    "relay_to",
    "serve_relay",
]

#: ``stream -> None``: a ``trio.serve_tcp``/``serve_ssl_over_tcp`` handler.
Handler = Callable[[trio.abc.Stream], Awaitable[None]]


async def pump(
    source: trio.abc.ReceiveStream,
    sink: trio.abc.SendStream,
    broken: Callable[[], object] = lambda: None,
) -> None:
    """Copy ``source`` to ``sink`` until end of stream, then half-close ``sink``, or close it
    when it cannot half-close (TLS): HTTP clients close whole connections, never half.
    A broken or closed stream (a reset, a failed TLS handshake) calls ``broken``, which stops
    the other direction too."""
    try:
        async for chunk in source:
            await sink.send_all(chunk)
        if isinstance(sink, trio.abc.HalfCloseableStream):
            await sink.send_eof()
        else:
            await sink.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        broken()


def relay_to(host: str, port: int, *, tls: ssl.SSLContext | None = None) -> Handler:
    """A handler that relays each connection to ``host:port`` (over TLS with ``tls``, checked
    against ``host``)."""

    async def handler(stream: trio.abc.Stream) -> None:
        async with stream:
            try:
                tcp = await trio.open_tcp_stream(host, port)
            except OSError:
                return
            upstream: trio.abc.Stream = tcp
            if tls is not None:
                upstream = trio.SSLStream(tcp, tls, server_hostname=host)
            async with upstream, trio.open_nursery() as nursery:
                stop = nursery.cancel_scope.cancel
                nursery.start_soon(pump, stream, upstream, stop)
                nursery.start_soon(pump, upstream, stream, stop)

    return handler


def pinned_client(pem: str) -> ssl.SSLContext:
    """A client context that trusts the run's certificate ``pem`` and nothing else."""
    return ssl.create_default_context(cadata=pem)


class AllowedPeers:
    """The peers the supervisor's relay accepts: loopback and ``always`` (the head's own
    address) for the run's lifetime, plus the addresses of the last :meth:`update`."""

    def __init__(self, *always: str) -> None:
        self._always = frozenset(peer_address(address) for address in always)
        self._nodes: frozenset[str] = frozenset()

    def update(self, addresses: Iterable[str]) -> frozenset[str]:
        """The alive nodes' addresses now (a node that left is refused from here on); the
        addresses that left (to cut their open connections), never loopback or ``always``."""
        before, self._nodes = self._nodes, frozenset(peer_address(a) for a in addresses)
        return frozenset(a for a in before - self._nodes if a not in self)

    def __contains__(self, address: object) -> bool:
        if not isinstance(address, str):
            return False
        address = peer_address(address)
        return address in self._always or address in self._nodes or is_loopback_host(address)


class PeerFilter(trio.abc.Listener[trio.SocketStream]):
    """A TCP listener that hands out only connections from ``peers``: any other is reset as
    it is accepted (nothing read from it), and ``refused(address)`` is called the first time
    an address is refused."""

    def __init__(
        self,
        inner: trio.SocketListener,
        peers: AllowedPeers,
        refused: Callable[[str], None] = lambda address: None,
    ) -> None:
        self.inner = inner
        self.peers = peers
        self.refused = refused
        self._told: set[str] = set()

    async def accept(self) -> trio.SocketStream:
        while True:
            stream = await self.inner.accept()
            try:
                address = str(stream.socket.getpeername()[0])
            except OSError:  # gone already
                address = ""
            if address and address in self.peers:
                return stream
            # SO_LINGER 0: the close is a reset, so nothing of the peer's is ever read.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stream.socket.close()
            if address and address not in self._told:
                self._told.add(address)
                self.refused(address)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def serve_relay(
    handler: Handler,
    host: str,
    tls: ssl.SSLContext | None,
    peers: AllowedPeers,
    refused: Callable[[str], None] = lambda address: None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handler`` on ``host`` (TLS with ``tls``) to ``peers`` only; report its port."""
    listeners = await trio.open_tcp_listeners(0, host=host)
    port = int(listeners[0].socket.getsockname()[1])
    guarded: list[trio.abc.Listener[trio.abc.Stream]] = []
    for listener in listeners:
        allowed = PeerFilter(listener, peers, refused)
        guarded.append(allowed if tls is None else trio.SSLListener(allowed, tls))
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(trio.serve_listeners, handler, guarded))
        task_status.started(port)
