"""Byte relays on the bridge's path across nodes, and their TLS.

The supervisor serves one on the head's cluster address in front of the bridge's loopback
listener; each node agent serves one on its own loopback in front of the supervisor's, so a
rollout on any node keeps a loopback ``chat_completions_url``. Between the two, the hop over
the cluster network is TLS with a certificate made for the run (:func:`run_certificate`): the
agents trust that one certificate and nothing else (it reaches them as an actor argument), and
its key never leaves the head. The relays read nothing: the bridge checks the route and the
per-run bearer of every request itself.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio

__all__ = ["RunCertificate", "pinned_client", "pump", "relay_to", "run_certificate"]

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
    directory = Path(tempfile.mkdtemp(prefix="rollbridge-tls-"))
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


def pinned_client(pem: str) -> ssl.SSLContext:
    """A client context that trusts the run's certificate ``pem`` and nothing else."""
    return ssl.create_default_context(cadata=pem)
