"""The node agent: the Ray actor that runs one rollout-server replica on its node.

The supervisor makes one per node (:mod:`launcher.cluster.run`), pinned there, and owns it: if
the supervisor dies the actor fate-shares, and the lifeline (:mod:`launcher.cluster.lifeline`)
then stops the server. The agent:

- serves a loopback relay to the supervisor's bridge relay, so rollouts keep a loopback
  ``chat_completions_url`` (the SDK's loopback fast path and Harbor's probe ladder work);
- builds (or finds) the rollout's environment on this node from the bundle the supervisor
  shipped (:mod:`launcher.cluster.ship`), and starts the rollout server from it exactly as a
  local run does (:func:`start_rollout_server`: its own process group, ``/health`` proving it
  ours), with its artifact root on this node;
- runs items: admits on loopback, long-polls to the terminal result, and returns the result
  with the rollout's trial directory packed (:mod:`launcher.cluster.trial`), which the
  supervisor unpacks into the run directory before it journals the result. Items come in
  batches (``submit``) and their answers go back in batches (``collect``, a long-poll
  answered with every answer finished since the previous one; ``exchange`` is a submit and
  the next collect in one call), so the supervisor makes far fewer actor calls than it runs
  items (:mod:`launcher.cluster.batch`); ``run_item`` runs one item per call.

A dead-man switch (:attr:`AgentSpec.deadman_s`): when no call has come from the supervisor
for that long (its pings come every 2 s), a partition that did not heal or a supervisor that
hangs, the agent stops its rollout server through the lifeline and fails every call after
(:class:`ReplicaStopped`: the supervisor, if it comes back, requeues what ran there). Ray
alone would leave the server running until the partition heals.

Ray runs async actors on an asyncio loop; the agent's logic is trio, on a thread of its own
beside that loop (:class:`_Trio`), so it reuses the rollout client and the server start-up of
the local path. asyncio appears only as the loop Ray calls the actor's methods on.

Why one module of this size: it is the one actor class Ray instantiates on a node, with the
small runner that gives it trio; the two are read together, and splitting the actor's methods
across modules would only scatter one object's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec
import trio

from launcher.cluster.flags import without_ray_vars
from launcher.cluster.relay import pinned_client, relay_to
from launcher.cluster.ship import NodeEnv, ShipInfo, ensure_env
from launcher.cluster.trial import Packed, pack_trial, packed_size
from launcher.dispatch import RolloutRefused
from launcher.dispatch_io import RolloutClientTransport
from launcher.resultwait import batched_wait_wanted
from launcher.rollout_child import RolloutServer, ServerLaunch, start_rollout_server
from rollout_server.harbor.bundle import SHIPPED_BUNDLE_ENV
from rollout_server.harbor.cachekeep import Pruned
from rollout_server.protocol import RolloutInitRequest

__all__ = ["AgentSpec", "NodeAgent", "ReplicaStopped"]

T = TypeVar("T")
_LIFELINE = Path(__file__).with_name("lifeline.py")
_TAIL_LINES = 200


class AgentSpec(msgspec.Struct, kw_only=True):
    """What an agent needs to start its replica (an actor argument, never a runtime_env)."""

    python: str
    entrypoint: str
    rollout_dir: str
    config_env: dict[str, str]
    secrets: dict[str, str]
    relay_host: str
    relay_port: int
    relay_cert: str | None = None
    """The PEM of the run's certificate the supervisor's relay presents (None: plain TCP)."""
    ship: ShipInfo | None = None
    """The shipped bundle to build the environment from (None: ``python`` and ``rollout_dir``
    as they are, a shared filesystem)."""
    stop_grace_s: float = 5.0
    guest: bool = False
    """Run the agent's trio in guest mode on Ray's loop, not on a thread of its own (the
    benchmark's baseline, ``ROLLBRIDGE_AGENT_GUEST=1``)."""
    deadman_s: float = 0.0
    """Stop the replica when no call came from the supervisor for this long (0: never;
    launcher.cluster.flags.DEADMAN_ENV)."""


class ReplicaStopped(Exception):
    """The agent stopped its replica by itself (its dead-man switch): calls fail with this."""


def _spawn_lifeline(
    pgid: int, grace_s: float, root: Path, containers: bool
) -> subprocess.Popen[bytes]:
    """Start the lifeline on ``pgid`` and ``root`` (and, with ``containers``, the containers the
    server owns); its first process exits once the watchdog forked."""
    argv = [sys.executable, str(_LIFELINE), str(pgid), str(grace_s), str(root)]
    process = subprocess.Popen([*argv, "containers"] if containers else argv, stdin=subprocess.PIPE)
    process.wait()
    return process


def _pack_and_remove(trial: Path) -> Packed:
    """``trial`` packed, then deleted: one worker-thread trip for both."""
    packed = pack_trial(trial)
    shutil.rmtree(trial, ignore_errors=True)
    return packed


def _loopback(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, ""))


class _Trio:
    """The agent's trio run, beside Ray's asyncio loop; :meth:`call` runs a trio function.

    By default trio runs on a thread of its own (``trio.run``), so its I/O waits are its own
    ``epoll``; an actor call crosses to it once (``run_sync_soon``) and its answer crosses back
    once (``call_soon_threadsafe``). With ``guest`` it runs in guest mode on the asyncio loop
    instead (``start_guest_run``, the design's first choice, kept as the benchmark's baseline:
    ``ROLLBRIDGE_AGENT_GUEST=1`` on the supervisor): there every trio tick that waits for I/O
    hands its ``epoll`` wait to a worker thread and its wake-up back to the loop, which the
    relay's byte pumps and the loopback HTTP of every item pay many times over
    (docs/scale-out.md "The node agent's trio").
    """

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self._stop = trio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.finished = threading.Event()
        """Set once the trio run has ended (after :meth:`stop`, or when it failed)."""

    async def start(self, guest: bool) -> None:
        loop = self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self.token = trio.lowlevel.current_trio_token()
                loop.call_soon_threadsafe(_settle, ready, None, None)
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        if guest:
            trio.lowlevel.start_guest_run(
                main,
                run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                done_callback=lambda _outcome: self.finished.set(),
            )
        else:

            def run() -> None:
                try:
                    trio.run(main)
                except BaseException as exc:  # reported to the actor's caller (start)
                    with contextlib.suppress(RuntimeError):  # the loop closed: the actor exits
                        loop.call_soon_threadsafe(_settle, ready, None, exc)
                finally:
                    self.finished.set()

            threading.Thread(target=run, name="rollbridge-agent-trio", daemon=True).start()
        await ready

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        assert self.token is not None and self.nursery is not None and self._loop is not None
        loop = self._loop
        result: asyncio.Future[T] = loop.create_future()
        nursery = self.nursery

        async def runner() -> None:
            try:
                value = await fn(*args)
            except trio.Cancelled:
                loop.call_soon_threadsafe(_settle, result, None, None, True)
                raise
            except Exception as exc:
                loop.call_soon_threadsafe(_settle, result, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, result, value, None)

        self.token.run_sync_soon(nursery.start_soon, runner)
        return await result

    def stop(self) -> None:
        assert self.token is not None
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self._stop.set)


def _settle(
    future: asyncio.Future[Any],
    value: Any,
    error: BaseException | None,
    cancelled: bool = False,
) -> None:
    """Resolve ``future`` (on its loop's thread) unless it is done already."""
    if future.done():
        return
    if cancelled:
        future.cancel()
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class NodeAgent:
    """One replica on one node (made a Ray actor by :mod:`launcher.cluster.run`)."""

    def __init__(self) -> None:
        self._trio = _Trio()
        self._server: RolloutServer | None = None
        self._transport: RolloutClientTransport | None = None
        self._forward_port = 0
        self._root: Path | None = None
        self._lifeline: subprocess.Popen[bytes] | None = None
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._answers: deque[tuple[str, tuple[Any, ...]]] = deque()
        self._answered: trio.Event | None = None
        self._env: NodeEnv | None = None  # holds its environment's use lock for the agent's life
        self._heard = time.monotonic()  # the supervisor's last call (the dead-man switch)
        self._stopped: str | None = None  # why the switch stopped the replica

    async def start(self, spec_json: bytes, shipped: list[Any] | None = None) -> dict[str, Any]:
        """Start the relay, the rollout server and its lifeline; return this replica's facts.

        ``shipped`` holds the object-store reference of the bundle's bytes (nested in a list, so
        Ray leaves it unresolved: it is fetched only when this node lacks the environment)."""
        spec = msgspec.json.decode(spec_json, type=AgentSpec)
        await self._trio.start(spec.guest)
        return await self._trio.call(self._start, spec, shipped)

    async def _start(self, spec: AgentSpec, shipped: list[Any] | None) -> dict[str, Any]:
        nursery = self._trio.nursery
        assert nursery is not None
        python, entrypoint, rollout_dir = spec.python, spec.entrypoint, spec.rollout_dir
        built: bool | None = None
        pruned = Pruned()
        base_env = without_ray_vars(os.environ)
        if spec.ship is not None and shipped:
            ref = shipped[0]

            def fetch() -> bytes:
                import ray

                data: bytes = ray.get(ref)
                return data

            env = await trio.to_thread.run_sync(ensure_env, spec.ship, fetch)
            python, entrypoint, rollout_dir = (
                str(env.python),
                str(env.entrypoint),
                str(env.rollout_dir),
            )
            built, pruned, self._env = env.built, env.pruned, env
            base_env[SHIPPED_BUNDLE_ENV] = str(env.bundle)
        tls = pinned_client(spec.relay_cert) if spec.relay_cert else None
        handler = relay_to(spec.relay_host, spec.relay_port, tls=tls)
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        self._forward_port = int(listeners[0].socket.getsockname()[1])
        self._root = Path(tempfile.mkdtemp(prefix="rollbridge-agent-"))
        try:
            launch = ServerLaunch(
                python=Path(python),
                entrypoint=Path(entrypoint),
                rollout_dir=Path(rollout_dir),
                run_dir=self._root,
                base_env=base_env,
                config_env=spec.config_env,
                secrets=spec.secrets,
            )
            server = await start_rollout_server(
                nursery,
                launch,
                sink=self._tail.append,
                log=lambda *_: None,
                stage=lambda _: None,
                redact=str,
            )
            self._server = server
            server.batched_wait = batched_wait_wanted(server.health)  # each node its own
            self._transport = RolloutClientTransport(server.client, server)
            self._lifeline = await trio.to_thread.run_sync(
                _spawn_lifeline,
                server.child.pid,
                spec.stop_grace_s,
                self._root,
                server.health.backend == "harbor",
            )
        except BaseException:
            # No lifeline yet to remove the directory: a server that did not start (or a
            # supervisor gone meanwhile) left it on the node for good.
            shutil.rmtree(self._root, ignore_errors=True)
            raise
        if spec.deadman_s > 0:
            nursery.start_soon(self._deadman, spec.deadman_s)
        capacity = await server.probe_capacity()
        return {
            "capacity": capacity,
            "server_pid": server.child.pid,
            "pid": os.getpid(),
            "sdk_version": server.sdk_version,
            "python": python,
            "env_built": built,
            "env_pruned": [pruned.entries, pruned.bytes],
        }

    def _hear(self) -> None:
        """A call from the supervisor: it is alive (and this replica has not stopped)."""
        self._heard = time.monotonic()
        if self._stopped is not None:
            raise ReplicaStopped(self._stopped)

    async def _deadman(self, after_s: float) -> None:
        """The dead-man switch: with no call from the supervisor for ``after_s`` (a partition
        that does not heal, a supervisor that hangs), stop the rollout server (the lifeline's
        work: its group, its directory, a Harbor server's containers) and fail every call."""
        while True:
            # _heard moves on the actor's loop thread: look again when it would run out.
            left = self._heard + after_s - time.monotonic()
            if left <= 0:
                break
            await trio.sleep(left)
        self._stopped = (
            f"no call from the supervisor for {after_s:g}s: the node agent stopped its rollout "
            "server (the dead-man switch)"
        )
        self._tail.append(self._stopped)
        if self._lifeline is not None and self._lifeline.stdin is not None:
            self._lifeline.stdin.close()  # the lifeline stops the server's group
        if self._answered is not None:
            self._answered.set()  # a collect waiting fails now

    async def run_item(self, request_json: bytes, admission_timeout_s: float) -> tuple[Any, ...]:
        """Run one rollout to its terminal result: ``("result", result json, packed trial)``
        (:func:`~launcher.cluster.trial.pack_trial`) or
        ``("refused", status, message, kind)``."""
        self._hear()
        answer = await self._trio.call(self._run_item, request_json, admission_timeout_s)
        self._hear()  # an item the switch cut short is not its row's failure
        return answer

    async def submit(self, items: list[tuple[bytes, float]]) -> None:
        """Start each ``(request json, admission timeout)``; their answers (as :meth:`run_item`
        returns, or ``("error", text)`` when running one raised) wait for :meth:`collect`."""
        self._hear()
        await self._trio.call(self._submit, items)

    async def _submit(self, items: list[tuple[bytes, float]]) -> None:
        assert self._trio.nursery is not None
        for request_json, admission_timeout_s in items:
            request = msgspec.json.decode(request_json, type=RolloutInitRequest)
            self._trio.nursery.start_soon(self._run_queued, request, admission_timeout_s)

    async def _run_queued(self, request: RolloutInitRequest, admission_timeout_s: float) -> None:
        try:
            answer = await self._run_request(request, admission_timeout_s)
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        self._answers.append((request.rollout_id, answer))
        if self._answered is not None:
            self._answered.set()

    async def exchange(
        self, items: list[tuple[bytes, float]], max_items: int, max_bytes: int, linger_s: float
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """:meth:`submit` ``items``, then :meth:`collect`: one actor call for both."""
        self._hear()
        return await self._trio.call(self._exchange, items, max_items, max_bytes, linger_s)

    async def _exchange(
        self, items: list[tuple[bytes, float]], max_items: int, max_bytes: int, linger_s: float
    ) -> list[tuple[str, tuple[Any, ...]]]:
        await self._submit(items)
        return await self._collect(max_items, max_bytes, linger_s)

    async def collect(
        self, max_items: int, max_bytes: int, linger_s: float
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """Wait for an answer and ``linger_s`` more (for the answers finishing with it), then
        return ``(rollout id, answer)`` for every answer finished, at most ``max_items`` and
        about ``max_bytes`` of trial tars (one answer always)."""
        self._hear()
        return await self._trio.call(self._collect, max_items, max_bytes, linger_s)

    async def _collect(
        self, max_items: int, max_bytes: int, linger_s: float
    ) -> list[tuple[str, tuple[Any, ...]]]:
        while not self._answers and self._stopped is None:
            self._answered = trio.Event()
            await self._answered.wait()
        if len(self._answers) < max_items and self._stopped is None:
            await trio.sleep(linger_s)
        if self._stopped is not None:  # answers cut short by the switch are no rows' failures
            raise ReplicaStopped(self._stopped)
        batch: list[tuple[str, tuple[Any, ...]]] = []
        size = 0
        while self._answers and len(batch) < max_items:
            answer = self._answers[0][1]
            weight = packed_size(answer[2]) if answer[0] == "result" else 0
            if batch and size + weight > max_bytes:
                break
            batch.append(self._answers.popleft())
            size += weight
        return batch

    async def _run_item(self, request_json: bytes, admission_timeout_s: float) -> tuple[Any, ...]:
        request = msgspec.json.decode(request_json, type=RolloutInitRequest)
        return await self._run_request(request, admission_timeout_s)

    async def _run_request(
        self, request: RolloutInitRequest, admission_timeout_s: float
    ) -> tuple[Any, ...]:
        assert self._transport is not None and self._root is not None
        request = msgspec.structs.replace(
            request,
            chat_completions_url=_loopback(request.chat_completions_url, self._forward_port),
        )
        try:
            handle = await self._transport.admit(request, admission_timeout_s)
        except RolloutRefused as exc:
            return ("refused", exc.status_code, str(exc), exc.kind)
        result = await handle.wait()
        trial = self._root / "rollout_trials" / request.rollout_id
        packed = await trio.to_thread.run_sync(_pack_and_remove, trial)
        return ("result", msgspec.json.encode(result), packed)

    async def cancel(self, rollout_id: str) -> None:
        """Ask the local server to cancel one rollout."""
        self._hear()
        if self._transport is not None:
            await self._trio.call(self._transport.cancel, rollout_id)

    async def health(self) -> bool:
        """Whether the rollout server answers ``/health`` (the supervisor's ping)."""
        self._hear()
        if self._server is None:
            return False
        try:
            await self._trio.call(self._server.client.health)
        except Exception:
            return False
        return True

    async def tail(self) -> list[str]:
        """The server's last output lines (for the supervisor's log when a replica fails)."""
        return list(self._tail)

    async def stop(self, grace_s: float) -> None:
        """Stop the server (SIGTERM, then its group after ``grace_s``) and the relay."""
        if self._server is not None:
            await self._trio.call(self._server.stop, grace_s)
        if self._lifeline is not None and self._lifeline.stdin is not None:
            self._lifeline.stdin.close()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        with contextlib.suppress(AssertionError):
            self._trio.stop()
