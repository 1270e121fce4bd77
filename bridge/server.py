"""Running the bridge as a trio service: ``run_bridge`` and its handle."""

from __future__ import annotations

import socket
from collections.abc import Callable, Container
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol
from urllib.parse import quote

import trio

from bridge.apis import ApiOptions
from bridge.errors import BridgeBindError
from bridge.policy import MAX_BODY_BYTES
from bridge.probe import ProbeKey
from bridge.upstreams.routing import OFFLINE_MODEL

if TYPE_CHECKING:
    from bridge.calls import CallBook, CallObserver
    from bridge.handler import Bridge
    from bridge.retry import RetryPolicy
    from bridge.revoke import Revocations
    from bridge.tls import ClusterDoor
    from bridge.usage import RolloutUsage, UpstreamPressure, UsageObserver


#: The modules a starting bridge imports (about 0.3-0.6 s): whoever wants that cost off its
#: critical path imports them ahead (a worker thread, a spare process).
WEB_STACK: Final = (
    "rollout_server.net.leanserve",
    "bridge.app",
    "bridge.handler",
    "bridge.upstreams.direct",
)


#: The listen backlog: a burst of rollouts connects at once.
_BACKLOG: Final = 4096


@dataclass(frozen=True)
class BridgeConfig:
    """Everything the bridge needs to serve one run (or one daemon)."""

    model: str
    """``[experiment].model_path``: ``openai/gpt-4o-mini``, ``openrouter/…``, ``rollbridge/echo``…"""
    token: str
    """The per-run bearer every request must carry."""
    host: str = "127.0.0.1"
    port: int = 0
    """``--listener-port``, or 0 for an ephemeral port."""
    keepalive: bool = False
    """Public-URL mode (docs/spec/bridge.md §9) at start; :attr:`BridgeHandle.keepalive` switches it."""
    redact: Callable[[str], str] | None = None
    """The run's redactor, applied to every error message and log line after the bridge's own."""
    log: Callable[[str, str], None] | None = None
    """``(level, message)`` sink for the bridge's log lines."""
    plain_chat_route: bool = False
    """Daemon mode: also serve ``POST /v1/chat/completions`` (usage id from a header)."""
    per_rollout_bearers: bool = False
    """A rollout's URL accepts only that rollout's bearer (:mod:`bridge.bearers`), not
    :attr:`token`: ``eval run`` gives each rollout its own."""
    via_litellm: bool = False
    """Send every call through LiteLLM even when a direct path exists (diagnostics, benchmarks)."""
    upstream_http2: bool = False
    """Call the provider over HTTP/2 on the direct path (``[bridge] upstream_http2``,
    :mod:`bridge.upstreams.h2pool`): ALPN ``h2`` for https, h2c for http."""
    heartbeat_interval: float = 15.0
    """Seconds between ``: ping`` comments while a streamed answer is silent."""
    keepalive_grace: float = 90.0
    """Keepalive mode: seconds a non-streaming call may take before a 200 is committed."""
    keepalive_interval: float = 30.0
    """Keepalive mode: seconds between trickled spaces after that."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Largest accepted request body; larger ones get 413."""
    retry: RetryPolicy | None = None
    """How transient upstream faults are retried (None: the default policy of
    :mod:`bridge.retry`; ``RetryPolicy(max_attempts=1)`` turns retries off)."""

    probe_key: bytes | None = None
    """The key behind sandbox probe answers (bridge.probe); None draws one at start."""
    usage_observer: UsageObserver | None = None
    """Told of every call's usage as it is recorded (bridge.usage.UsageObserver)."""
    call_observer: CallObserver | None = None
    """Told of every finished call's record (bridge.calls)."""
    keep_calls: bool = False
    """Keep each call's record per rollout until popped (a supervisor's in-process bridge,
    which records them with the results); a standalone bridge keeps none."""
    apis: ApiOptions | None = None
    """The Responses and Messages routes' options (hosted tools granted, native or translated)."""

    def __post_init__(self) -> None:
        if not isinstance(self.token, str) or not self.token.strip():
            raise ValueError("bridge auth_token must be a non-empty string")
        if not self.model:
            raise ValueError("bridge model must be a non-empty string")


def rollout_url(base: str, rollout_id: str) -> str:
    """The ``chat_completions_url`` handed to a rollout (its client appends ``/chat/completions``).

    ``base`` is the bridge's base URL as the rollout reaches it (loopback, tunnel or advertised;
    a trailing slash is ignored); the rollout id is percent-encoded as one path segment.
    """
    return f"{base.rstrip('/')}/v1/rollouts/{quote(rollout_id, safe='')}"


class UsageView(Protocol):
    """What a bridge's starter reads of its usage (a :class:`bridge.usage.UsageLedger`)."""

    def pop(self, rollout_id: str) -> RolloutUsage | None: ...

    def discard(self, rollout_id: str) -> None: ...

    def snapshot(self) -> dict[str, RolloutUsage]: ...

    def pressure(self) -> UpstreamPressure: ...


class BridgeService(Protocol):
    """A running bridge as its starter sees it: a :class:`BridgeHandle` (in this process) or a
    :class:`bridge.process.BridgeProcessHandle` (a bridge in its own process)."""

    @property
    def base_url(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def ledger(self) -> UsageView: ...

    @property
    def calls(self) -> CallBook: ...

    keepalive: bool

    def probe_answer(self, nonce: str) -> str: ...

    def rollout_url(self, rollout_id: str, base: str | None = None) -> str: ...

    async def settled(self) -> None: ...

    async def revoke(self, rollout_id: str) -> None: ...

    async def wait_failed(self) -> str: ...

    async def start_tls(self, host: str) -> str | None: ...

    async def adopt(self, sock: socket.socket, still_allowed: Container[str] = ()) -> None: ...

    async def cut(self, address: str) -> int: ...


class BridgeHandle:
    """What a running bridge reports to whoever started it."""

    def __init__(
        self,
        base_url: str,
        port: int,
        bridge: Bridge,
        probe: ProbeKey | None = None,
        door: ClusterDoor | None = None,
    ) -> None:
        self.base_url = base_url
        """``http://127.0.0.1:<port>``, no trailing slash."""
        self.port = port
        self.ledger = bridge.ledger
        """Usage per rollout id; pop a rollout's totals when its result arrives."""
        self.calls = bridge.calls
        """Call records per rollout id (bridge.calls); pop them with the usage."""
        self._bridge = bridge
        self._probe = probe or ProbeKey()
        self._door = door

    def probe_answer(self, nonce: str) -> str:
        """What ``GET /v1/rollbridge/probe/<nonce>`` answers in ``rollbridge_probe``
        (bridge.probe); raises ``ValueError`` for an invalid nonce."""
        return self._probe.answer(nonce)

    @property
    def keepalive(self) -> bool:
        """Whether keepalive mode (public URL) is on; setting it applies to requests from now."""
        return self._bridge.keepalive

    @keepalive.setter
    def keepalive(self, on: bool) -> None:
        self._bridge.keepalive = on

    def rollout_url(self, rollout_id: str, base: str | None = None) -> str:
        """:func:`rollout_url` for ``rollout_id`` at ``base`` (default: this bridge's loopback URL)."""
        return rollout_url(base or self.base_url, rollout_id)

    async def settled(self) -> None:
        """Settings apply at once in this process (the process variant waits for its child)."""
        await trio.lowlevel.checkpoint()

    @property
    def revocations(self) -> Revocations:
        """The revoked rollout ids (bridge.revoke)."""
        return self._bridge.revoked

    async def revoke(self, rollout_id: str) -> None:
        """Refuse every call of ``rollout_id`` from now on (bridge.revoke); return once its
        calls in flight, cancelled, have ended (or after :data:`bridge.revoke.SETTLE_S`)."""
        self._bridge.revoked.revoke(rollout_id)
        await self._bridge.revoked.settled(rollout_id)

    async def wait_failed(self) -> str:
        """Never returns: a bridge in this process fails with its caller (the process variant,
        :class:`bridge.process.BridgeProcessHandle`, returns the reason its child died)."""
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def start_tls(self, host: str) -> str | None:
        """Make the run's certificate for the cluster address ``host`` (:mod:`bridge.tls`):
        connections given to :meth:`adopt` from then on are served over TLS with it. Its PEM,
        for the node agents to pin; None when no ``openssl`` is found (plain TCP)."""
        assert self._door is not None, "a handle made by run_bridge"
        return await self._door.start_tls(host)

    async def adopt(self, sock: socket.socket, still_allowed: Container[str] = ()) -> None:
        """Serve the accepted connection ``sock`` (its peer checked by the caller, and again
        against ``still_allowed`` when given: closed if no longer in it): over TLS after
        :meth:`start_tls`. The bridge owns it from here (the caller keeps no copy)."""
        assert self._door is not None, "a handle made by run_bridge"
        try:
            gone = bool(still_allowed) and str(sock.getpeername()[0]) not in still_allowed
        except OSError:
            gone = True
        if gone:
            sock.close()
        else:
            self._door.adopt(sock)
        await trio.lowlevel.checkpoint()

    async def cut(self, address: str) -> int:
        """Close every connection adopted from the peer ``address``; return, once they are
        closed, how many were open."""
        assert self._door is not None, "a handle made by run_bridge"
        return await self._door.cut(address)


def _bind(host: str, port: int) -> socket.socket:
    where = f"{host}:{port}" if port else host
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise BridgeBindError(f"could not bind the LLM bridge on {where}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise BridgeBindError(f"could not bind the LLM bridge on {where}: {exc}") from exc
    return sock


def _base_url(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}", port


async def run_bridge(
    config: BridgeConfig, *, task_status: trio.TaskStatus[BridgeHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the bridge until cancelled. Use with ``nursery.start``, which returns the handle.

    The socket is bound first, so a bind failure raises :class:`BridgeBindError` before
    anything is reported as started.
    """
    sock = _bind(config.host, config.port)
    try:
        # Imported here: quart and httpx cost half a second, which ``import bridge`` (and so
        # the CLI) should not pay.
        from bridge.app import create_app
        from bridge.handler import Bridge, Timing
        from bridge.tls import ClusterDoor
        from bridge.upstreams import make_upstream
        from bridge.upstreams.direct import LazyClient
        from rollout_server.net.leanserve import LeanConfig, serve_lean

        client = LazyClient(http2=config.upstream_http2)
        try:
            async with trio.open_nursery() as nursery:
                if client.h2wire is not None:  # HTTP/2 to the provider: its readers run here
                    await nursery.start(client.h2wire.serve)
                bridge = Bridge(
                    make_upstream(config.model, client, via_litellm=config.via_litellm),
                    token=config.token,
                    nursery=nursery,
                    redact=config.redact,
                    log=config.log,
                    timing=Timing(
                        heartbeat=config.heartbeat_interval,
                        keepalive_grace=config.keepalive_grace,
                        keepalive_interval=config.keepalive_interval,
                    ),
                    keepalive=config.keepalive,
                    retry=config.retry,
                    usage_observer=config.usage_observer,
                    call_observer=config.call_observer,
                    keep_calls=config.keep_calls,
                )
                if client.h2wire is not None:  # an h2c fallback is told in the bridge's log
                    client.h2wire.log = bridge.log
                probe = ProbeKey(config.probe_key)
                app = create_app(
                    bridge,
                    token=config.token,
                    plain_chat_route=config.plain_chat_route,
                    per_rollout_bearers=config.per_rollout_bearers,
                    max_body=config.max_body_bytes,
                    probe=probe,
                    apis=config.apis,
                    http=client.http,
                )
                # The lean loop (rollout_server.net.leanserve), without hypercorn's trio
                # worker: plain HTTP/1.1 on loopback is all the bridge serves.
                lean = LeanConfig()
                lean.accesslog = None
                lean.errorlog = None
                lean.keep_alive_timeout = 75.0
                lean.graceful_timeout = 1.0
                lean.backlog = _BACKLOG  # serve_lean listens again with it
                await nursery.start(partial(serve_lean, app, lean, sockets=[sock]))
                base_url, port = _base_url(sock)
                bridge.log("info", f"LLM bridge listening on {base_url} for model {config.model}")
                door = ClusterDoor(app, lean, nursery)  # a --ray run's nodes (bridge.tls)
                task_status.started(BridgeHandle(base_url, port, bridge, probe, door))
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
    finally:
        sock.close()


__all__ = [
    "OFFLINE_MODEL",
    "WEB_STACK",
    "BridgeConfig",
    "BridgeHandle",
    "BridgeService",
    "UsageView",
    "rollout_url",
    "run_bridge",
]
