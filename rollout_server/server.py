"""Serving: :func:`serve` (blocking, for ``main.py``), :func:`serve_async` (for trio code and tests)
and :func:`create_app` (an ASGI app for any ASGI server).

Environment (set by the supervisor): ``_OSMOSIS_ROLLOUT_PORT`` (listen port, default 8000),
``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` (per-rollout files, default ``~/.osmosis``),
``_OSMOSIS_ROLLOUT_INSTANCE_ID`` (reported by ``/health``). The default host is ``127.0.0.1``
(where the supervisor probes); pass ``host="0.0.0.0"`` to accept connections from elsewhere.

Stopping: SIGINT/SIGTERM (in :func:`serve`) or :meth:`RunningServer.request_shutdown` start a
graceful shutdown: admissions get 503, in-flight rollouts drain (10 s), are cancelled (120 s),
then force-cancelled (10 s); the HTTP server keeps answering polls meanwhile and stops last.
A second signal skips the waits.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .app import DEFAULT_MAX_BODY_BYTES, RolloutApp
from .backend import ExecutionBackend
from .protocol import (
    DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    DEFAULT_RESULT_RETENTION_SEC,
    DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    ENV_PORT,
    ENV_SERVER_TOKEN,
    ENV_SUPERVISOR_PID,
    sdk_version,
)
from .sdk import shared_client
from .service import RolloutService

if TYPE_CHECKING:
    import httpx

    from .net.leanserve import LeanConfig

__all__ = ["KEEP_ALIVE_TIMEOUT_SEC", "RunningServer", "create_app", "serve", "serve_async"]

logger = logging.getLogger("rollout_server")

_GC_YOUNG_THRESHOLD = 50_000
"""Allocations between young-generation collections (Python's default is 700). At thousands of
rollouts in flight a request's objects (parsed bodies, headers, coroutine frames) outlive 700
allocations of other requests, so the collector walked them before they were freed anyway, and
promoted them to be walked again: 13-22% of a busy server's CPU (perf, 3,000 in flight). Cyclic
garbage waits at most this many allocations longer."""

KEEP_ALIVE_TIMEOUT_SEC = 2160.0
"""Idle keep-alive lifetime; outlives common load balancers' 2100 s idle timeout."""
_HTTP_GRACE_SEC = 5.0


def _env_port() -> int:
    raw = os.environ.get(ENV_PORT, "").strip()
    if not raw:
        return 8000
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_PORT} must be a port number, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{ENV_PORT} must be between 0 and 65535, got {port}")
    return port


@dataclass
class RunningServer:
    """A server started by :func:`serve_async` (what ``nursery.start`` returns)."""

    url: str
    """Base URL, e.g. ``http://127.0.0.1:43121`` (loopback even when bound to 0.0.0.0)."""
    host: str
    port: int
    service: RolloutService
    _shutdown: trio.Event = field(default_factory=trio.Event, repr=False)

    def request_shutdown(self) -> None:
        """Start the graceful shutdown; :func:`serve_async` returns when it is complete."""
        self._shutdown.set()

    def force_stop(self) -> None:
        """Stop at once: cancel every rollout and answer open polls."""
        self.service.close()
        self._shutdown.set()


def _configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
        # httpx/httpcore log every request at INFO: one line per model call in the run's logs.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _hypercorn_config(host: str, port: int) -> LeanConfig:
    from .net.leanserve import LeanConfig

    config = LeanConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT_SEC
    # A supervisor polls over the same few connections for hours; don't recycle them.
    config.keep_alive_max_requests = 1_000_000
    config.include_server_header = False
    config.graceful_timeout = _HTTP_GRACE_SEC
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    # A supervisor may open hundreds of connections at once; the default backlog (100) makes
    # the excess time out connecting.
    config.backlog = 4096
    return config


def _service(backend: ExecutionBackend, **options: Any) -> RolloutService:
    return RolloutService(backend, sdk_version=sdk_version(), **options)


def _workflow_http_client() -> httpx.AsyncClient:
    """The client workflows' model calls share, made when a rollout first reads its context's
    ``http_client`` (``chat()`` over its loopback path never does).

    httpx's default pool caps them at 100 at once and one big pool costs O(n^2) per request;
    the sharded transport has neither problem. Made on first use, so that importing httpx
    (a tenth of a second or more) is not part of the server's start.
    """
    import httpx

    from .client import POOL_SHARDS
    from .net.httpclient import ShardedTransport

    client = httpx.AsyncClient(
        timeout=httpx.Timeout(600.0, connect=10.0), transport=ShardedTransport(POOL_SHARDS)
    )
    if gc.get_freeze_count():
        # serve() froze the process's long-lived objects (see there): httpx's modules and this
        # client live as long, and left in the collector's generations they cost every full
        # collection, and about 10 ms at exit. (A process that froze nothing is left alone.)
        gc.freeze()
    return shared_client(client)  # chat() may bypass it for the loopback bridge (see there)


async def serve_async(
    backend: ExecutionBackend,
    *,
    host: str | None = None,
    port: int | None = None,
    api_key: str | None = None,
    result_wait_timeout_sec: float = DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    polling_lease_timeout_sec: float = DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    result_retention_sec: float = DEFAULT_RESULT_RETENTION_SEC,
    artifact_root: Path | str | None = None,
    instance_id: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    drain_timeout_sec: float = 10.0,
    cancel_timeout_sec: float = 120.0,
    force_timeout_sec: float = 10.0,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[RunningServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``backend`` until shut down; reports a :class:`RunningServer` via ``nursery.start``.

    ``port=None`` reads ``_OSMOSIS_ROLLOUT_PORT`` (default 8000); ``port=0`` picks a free port.
    ``artifact_root=None`` reads ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` at each save.
    ``instance_id=None`` reads ``_OSMOSIS_ROLLOUT_INSTANCE_ID``.
    """
    from .net.leanserve import serve_lean

    api_key = _server_token(api_key)
    supervisor = _supervisor_pid()
    host = host or "127.0.0.1"
    port = _env_port() if port is None else port
    config = _hypercorn_config(host, port)
    service = _service(
        backend,
        http_client_factory=_workflow_http_client,
        result_wait_timeout_sec=result_wait_timeout_sec,
        polling_lease_timeout_sec=polling_lease_timeout_sec,
        result_retention_sec=result_retention_sec,
        artifact_root=artifact_root,
        instance_id=instance_id,
        drain_timeout_sec=drain_timeout_sec,
        cancel_timeout_sec=cancel_timeout_sec,
        force_timeout_sec=force_timeout_sec,
    )
    app = RolloutApp(service, api_key=api_key, max_body_bytes=max_body_bytes)
    http_stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            binds: list[str] = await nursery.start(
                partial(serve_lean, app, config, shutdown_trigger=http_stop.wait)
            )
            bound_port = int(binds[0].rsplit(":", 1)[1])
            url_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
            url_host = f"[{url_host}]" if ":" in url_host and host != "::" else url_host
            if host == "::":
                url_host = "[::1]"
            running = RunningServer(
                url=f"http://{url_host}:{bound_port}", host=host, port=bound_port, service=service
            )
            signal_scope = trio.CancelScope()
            if handle_signals:
                await nursery.start(_watch_signals, running, signal_scope)
            watch_scope = trio.CancelScope()
            if supervisor is not None:
                nursery.start_soon(_watch_supervisor, running, supervisor, watch_scope)
            task_status.started(running)
            await running._shutdown.wait()
            await service.shutdown()
            signal_scope.cancel()
            watch_scope.cancel()
            http_stop.set()
    finally:
        if service.http_client is not None:
            await service.http_client.aclose()


def _supervisor_pid() -> int | None:
    """The pid of the supervisor that started this server (``ENV_SUPERVISOR_PID``), when it is
    still this process's parent; None otherwise (started by hand, or by another tool)."""
    raw = os.environ.pop(ENV_SUPERVISOR_PID, "").strip()
    if not raw.isdigit() or int(raw) != os.getppid():
        return None
    return int(raw)


#: Without a pidfd (not Linux), how often the server looks whether its supervisor is still its
#: parent.
SUPERVISOR_POLL_S = 1.0


async def _watch_supervisor(running: RunningServer, pid: int, scope: trio.CancelScope) -> None:
    """Shut down gracefully once the supervisor is gone (``kill -9``: this process is then
    another's child): nobody collects the results any more, and sandboxes should not outlive
    the run by more than the drain."""
    with scope:
        try:
            fd: int | None = os.pidfd_open(pid)  # readable once the process has ended (Linux)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                os.close(fd)
        else:
            while os.getppid() == pid:  # noqa: ASYNC110 -- no pidfd here: nothing to wait on
                await trio.sleep(SUPERVISOR_POLL_S)
        logger.info("the supervisor (pid %d) is gone: shutting down gracefully", pid)
        running.request_shutdown()


async def _watch_signals(
    running: RunningServer,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        first = True
        async for signum in signals:
            if first:
                logger.info("signal %s: shutting down gracefully", signal.Signals(signum).name)
                running.request_shutdown()
                first = False
            else:
                logger.info("second signal: stopping now")
                running.force_stop()


def serve(
    backend: ExecutionBackend,
    *,
    host: str | None = None,
    port: int | None = None,
    configure_logging: bool = True,
    **options: Any,
) -> None:
    """Serve ``backend`` in the foreground (blocking) until SIGINT/SIGTERM.

    This is what a rollout's ``main.py`` calls. ``options`` are :func:`serve_async`'s
    keyword arguments (``api_key``, ``result_wait_timeout_sec``, ...).
    """
    if configure_logging:
        _configure_logging()
    try:
        listen_port = _env_port() if port is None else port
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running: RunningServer = await nursery.start(
                partial(
                    serve_async,
                    backend,
                    host=host,
                    port=listen_port,
                    handle_signals=True,
                    **options,
                )
            )
            # Everything made so far (the SDK, the workflow's modules, the server's stack, the
            # service) lives as long as the process: left out of the collector's generations,
            # full collections only walk what requests and retained results allocate (the
            # collector was the largest single cost of a busy server). Frozen here, not before
            # trio.run: the server's stack is imported by serve_async.
            gc.freeze()
            gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
            logger.info("rollout server listening on %s", running.url)

    try:
        trio.run(main)
    except* OSError as group:
        # The OSErrors sit in nested groups (one level per nursery): flatten them in order.
        errors: list[BaseException] = [group]
        while any(isinstance(exc, BaseExceptionGroup) for exc in errors):
            errors = [
                leaf
                for exc in errors
                for leaf in (exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,))
            ]
        reason = "; ".join(str(exc) for exc in errors)
        print(
            f"Error: cannot serve on {host or '127.0.0.1'}:{listen_port}: {reason}", file=sys.stderr
        )
        raise SystemExit(1) from None


def create_app(
    backend: ExecutionBackend,
    *,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    **service_options: Any,
) -> RolloutApp:
    """An ASGI app (trio; e.g. for ``hypercorn --worker-class trio``) serving ``backend``.

    The rollout service starts with the ASGI lifespan and drains when it ends.
    ``service_options`` are :class:`~rollout_server.service.RolloutService` keyword arguments.
    """
    service = _service(backend, **service_options)
    return RolloutApp(
        service,
        api_key=_server_token(api_key),
        max_body_bytes=max_body_bytes,
        manage_service=True,
    )


def _server_token(api_key: str | None) -> str | None:
    """``api_key``, else the supervisor's bearer (``ENV_SERVER_TOKEN``), taken out of the
    environment so that workflows and what they start do not inherit it."""
    given = os.environ.pop(ENV_SERVER_TOKEN, None)
    if api_key is not None:
        return api_key
    return given if given and given.strip() else None
