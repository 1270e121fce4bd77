"""The managed cloudflared quick tunnel as a trio service, with self-healing.

:func:`run_cloudflared_tunnel` spawns ``cloudflared tunnel --config /dev/null --no-autoupdate
--url http://127.0.0.1:<bridge port>`` in its own session, drains its stderr for its whole life
into the run log (redacted), learns the public URL, waits until the tunnel is usable (spec A.7)
and hands a :class:`TunnelHandle` to the caller through ``task_status.started``.

After that it watches the process: when it exits, or its readiness endpoint (cloudflared's
metrics server ``/ready``) stops answering, it is restarted and the new URL is published on the
handle, so rollouts dispatched from then on use it. After ``max_restarts`` consecutive failed
attempts the handle reports a one-line failure and the service returns; the caller halts
dispatch.

Owning the processes is not this module's job: each cloudflared is handed to a
:class:`ChildOwner`, which records it (so that an orphan left by a killed caller can be found
later), stops it and forgets it. The caller supplies the owner; standalone use gets one that
records nothing and stops just the process.

Why one module of this size: start, readiness, watching and healing are one state machine over
one process at a time (``_Supervisor``); splitting the handle or the healing loop out would only
move lines and spread that state across files.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

import httpx
import trio

from tunnel.errors import TunnelError, TunnelRateLimited, TunnelRecordError, TunnelStartError
from tunnel.owner import ChildOwner, LogSink, Standalone, no_log, no_milestone, unredacted
from tunnel.parse import parse_stderr_line, ready_url

START_TIMEOUT = 30.0
#: SIGTERM → SIGKILL grace for a tunnel.
STOP_GRACE = 5.0
PROBE_INTERVAL = 1.0
REGISTRATION_GRACE = 1.0
STABILITY_WINDOW = 0.1
PROBE_TIMEOUT = 5.0

_QUICK_TUNNEL_DOCS = (
    "https://developers.cloudflare.com/cloudflare-one/networks/connectors/cloudflare-tunnel/"
    "do-more-with-tunnels/trycloudflare/"
)
RATE_LIMIT_MESSAGE = (
    "Cloudflare is rate-limiting quick-tunnel creation for this network (HTTP 429). Wait a few "
    "minutes and retry, or run your own tunnel and pass --advertise-url. Quick-tunnel limits: "
    + _QUICK_TUNNEL_DOCS
)
UNREACHABLE_TAIL = "sandboxes can no longer reach the model bridge"
_MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class TunnelOptions:
    """Everything the managed tunnel needs; timings default to the reference's constants.

    ``binary`` comes from :func:`tunnel.locate_cloudflared`, ``local_port`` is the bridge
    listener's port; everything else is passed by keyword. ``owner`` records and stops each
    cloudflared process (see :class:`ChildOwner`; None: record nothing, stop just the process).
    ``log`` receives every cloudflared stderr line (step ``cloudflared``, already passed through
    ``redact``) and the service's own events (step ``tunnel``); ``milestone`` receives stage
    lines for the terminal. ``stop_grace`` is the SIGTERM → SIGKILL grace of every stop.

    Self-healing: the readiness endpoint is probed every ``health_interval`` s and
    ``health_failures`` misses in a row count as "stopped answering". A restart is attempted
    after ``restart_backoff`` s (doubling, at most 30 s); ``max_restarts`` failed attempts in a
    row (a start that fails, or a tunnel that dies within ``stable_after`` s) end the service
    with a failure on the handle. ``max_restarts=0`` disables self-healing.

    ``probe_transport`` is the httpx transport used for probes of the public URL (a test seam);
    it is closed when the service ends.
    """

    binary: Path
    local_port: int
    _: KW_ONLY
    owner: ChildOwner | None = None
    log: LogSink = no_log
    milestone: Callable[[str], None] = no_milestone
    redact: Callable[[str], str] = unredacted
    start_timeout: float = START_TIMEOUT
    probe_interval: float = PROBE_INTERVAL
    registration_grace: float = REGISTRATION_GRACE
    stability_window: float = STABILITY_WINDOW
    stop_grace: float = STOP_GRACE
    health_interval: float = 5.0
    health_failures: int = 3
    max_restarts: int = 3
    restart_backoff: float = 1.0
    stable_after: float = 60.0
    probe_transport: httpx.AsyncBaseTransport | None = None

    def argv(self) -> list[str]:
        """The exact command line: an empty config so a user's named-tunnel config cannot apply."""
        return [
            str(self.binary),
            "tunnel",
            "--config",
            os.devnull,
            "--no-autoupdate",
            "--url",
            f"http://127.0.0.1:{self.local_port}",
        ]


class TunnelFailed(TunnelError):
    """The tunnel is gone for good; the message is the one-line cause for halting dispatch."""


class _TunnelState:
    """What the service knows about its tunnel; the service writes it, :class:`TunnelHandle`
    shows it to the caller."""

    def __init__(self) -> None:
        self.url = ""
        self.available = False
        self.generation = 0
        self.pid: int | None = None
        self.restarts = 0
        self.failure: str | None = None
        self.stop_confirmed: bool | None = None
        self.changed = trio.Event()
        self.failed = trio.Event()
        self.stop_requested = trio.Event()
        self.closed = trio.Event()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def publish(self, url: str, pid: int) -> None:
        """A new public URL works (served by ``pid``)."""
        self.url = url
        self.pid = pid
        self.available = True
        self.generation += 1
        self._notify()

    def lost(self) -> None:
        """The tunnel at :attr:`url` stopped working; a restart may follow."""
        self.available = False
        self._notify()

    def fail(self, reason: str) -> None:
        """The tunnel is gone for good, for the one-line ``reason``."""
        self.failure = reason
        self.available = False
        self.failed.set()
        self._notify()


class TunnelHandle:
    """The caller's view of a running managed tunnel (made by :func:`run_cloudflared_tunnel`).

    Read :attr:`public_url` (or ``await wait_available()``) at each dispatch: it changes after a
    restart. ``await wait_failed()`` returns the one-line cause once restarts are exhausted.
    ``stop()`` asks the service to stop the process and return; cancelling the service's scope
    does the same.
    """

    def __init__(self, state: _TunnelState) -> None:
        self._state = state

    @property
    def public_url(self) -> str:
        """The current public base URL (``https://<name>.trycloudflare.com``), no trailing ``/``."""
        return self._state.url

    @property
    def available(self) -> bool:
        """True while the tunnel at :attr:`public_url` is believed to work."""
        return self._state.available

    @property
    def generation(self) -> int:
        """Increases by one each time a new public URL is published (1 after the first start)."""
        return self._state.generation

    @property
    def pid(self) -> int | None:
        """Pid of the current cloudflared process."""
        return self._state.pid

    @property
    def restarts(self) -> int:
        """How many times the tunnel was restarted successfully."""
        return self._state.restarts

    @property
    def failure(self) -> str | None:
        """The one-line cause once the tunnel has failed for good, else None."""
        return self._state.failure

    @property
    def stop_confirmed(self) -> bool | None:
        """After the service ended: whether the last cloudflared process was seen to exit."""
        return self._state.stop_confirmed

    def stop(self) -> None:
        """Ask the service to stop cloudflared (SIGTERM, SIGKILL after the grace) and return."""
        self._state.stop_requested.set()

    async def wait_available(self) -> str:
        """Wait until a working public URL is published and return it.

        Raises :class:`TunnelFailed` once the tunnel has failed for good.
        """
        state = self._state
        while True:
            if state.failure is not None:
                raise TunnelFailed(state.failure)
            if state.available:
                return state.url
            await state.changed.wait()

    async def wait_url_change(self, generation: int) -> str:
        """Wait until a URL newer than ``generation`` is published and return it.

        Raises :class:`TunnelFailed` once the tunnel has failed for good.
        """
        state = self._state
        while True:
            if state.failure is not None:
                raise TunnelFailed(state.failure)
            if state.generation > generation and state.available:
                return state.url
            await state.changed.wait()

    async def wait_failed(self) -> str:
        """Wait until the tunnel has failed for good; return the one-line cause."""
        await self._state.failed.wait()
        assert self._state.failure is not None
        return self._state.failure

    async def wait_closed(self) -> None:
        """Wait until the service has returned and its process has been stopped."""
        await self._state.closed.wait()


@dataclass(eq=False)
class _Instance:
    """One cloudflared process and what its stderr has told us so far."""

    process: trio.Process
    url: str | None = None
    rate_limited: bool = False
    metrics_ready: str | None = None
    public_probe_ok: bool = False
    ready_at: float = 0.0
    end_reason: str | None = None
    first_news: trio.Event = field(default_factory=trio.Event)
    registered: trio.Event = field(default_factory=trio.Event)
    drain_done: trio.Event = field(default_factory=trio.Event)
    ended: trio.Event = field(default_factory=trio.Event)


async def run_cloudflared_tunnel(
    options: TunnelOptions,
    *,
    task_status: trio.TaskStatus[TunnelHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a self-healing cloudflared quick tunnel to ``127.0.0.1:<options.local_port>``.

    Use with ``handle = await nursery.start(run_cloudflared_tunnel, options)``: it returns once
    the first public URL is ready, or raises :class:`TunnelStartError` (one-line message;
    :class:`TunnelRateLimited` when Cloudflare refuses) or :class:`TunnelRecordError` (the
    owner could not record the process). The service
    returns after ``handle.stop()`` or when the tunnel has failed for good (see
    :meth:`TunnelHandle.wait_failed`); cancellation stops the process as well.
    """
    state = _TunnelState()
    timeout = httpx.Timeout(PROBE_TIMEOUT)
    startup_error: TunnelError | None = None
    try:
        async with (
            httpx.AsyncClient(
                transport=options.probe_transport, timeout=timeout, follow_redirects=False
            ) as public_client,
            httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as local,
            trio.open_nursery() as nursery,
        ):
            supervisor = _Supervisor(options, state, public_client, local, nursery)
            nursery.start_soon(_cancel_on_stop, state, nursery.cancel_scope)
            options.milestone("starting cloudflared quick tunnel")
            try:
                instance: _Instance = await nursery.start(supervisor.instance_main)
            except TunnelError as exc:
                startup_error = exc
                nursery.cancel_scope.cancel()
            else:
                state.publish(instance.url or "", instance.process.pid)
                options.log("INFO", "tunnel", "cloudflared tunnel ready", {"url": state.url})
                options.milestone(f"tunnel ready: {state.url}")
                task_status.started(TunnelHandle(state))
                await supervisor.heal(instance)
                nursery.cancel_scope.cancel()
    finally:
        state.closed.set()
    if startup_error is not None:
        raise startup_error


async def _cancel_on_stop(state: _TunnelState, scope: trio.CancelScope) -> None:
    await state.stop_requested.wait()
    scope.cancel()


class _Supervisor:
    def __init__(
        self,
        options: TunnelOptions,
        state: _TunnelState,
        public_client: httpx.AsyncClient,
        local_client: httpx.AsyncClient,
        nursery: trio.Nursery,
    ) -> None:
        self._options = options
        self._owner: ChildOwner = options.owner or Standalone()
        self._state = state
        self._public = public_client
        self._local = local_client
        self._nursery = nursery

    # -- one process --------------------------------------------------------------------------

    async def instance_main(self, *, task_status: trio.TaskStatus[_Instance]) -> None:
        """Spawn, record, wait until ready, then watch until it dies, stops answering or we stop."""
        options = self._options
        try:
            process = await trio.lowlevel.open_process(
                options.argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise TunnelStartError(f"could not start cloudflared: {exc}") from None
        instance = _Instance(process)
        failure: TunnelError | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain, instance)
                try:
                    await self._record(process.pid)
                    options.log("INFO", "tunnel", "cloudflared started", {"pid": process.pid})
                    await self._wait_ready(instance)
                    instance.ready_at = trio.current_time()
                    task_status.started(instance)
                    instance.end_reason = await self._watch(instance)
                except TunnelError as exc:
                    failure = exc
                finally:
                    with trio.CancelScope(shield=True):
                        await self._stop(instance)
                        with trio.move_on_after(1.0):
                            await instance.drain_done.wait()
                    nursery.cancel_scope.cancel()
        finally:
            if process.stderr is not None:
                with trio.CancelScope(shield=True):
                    await process.stderr.aclose()
            instance.ended.set()
        if failure is not None:
            raise failure

    async def _record(self, pid: int) -> None:
        try:
            await trio.to_thread.run_sync(self._owner.record, pid, self._options.local_port)
        except ProcessLookupError:
            raise TunnelRecordError(
                "could not identify the cloudflared process for orphan cleanup"
            ) from None
        except OSError as exc:
            raise TunnelRecordError(
                f"could not record cloudflared for orphan cleanup: {exc}"
            ) from None

    async def _drain(self, instance: _Instance) -> None:
        stream = instance.process.stderr
        assert stream is not None
        pending = bytearray()
        try:
            while chunk := await stream.receive_some(65536):
                pending += chunk
                while (newline := pending.find(b"\n")) >= 0:
                    self._on_line(instance, bytes(pending[:newline]))
                    del pending[: newline + 1]
                if len(pending) > _MAX_LINE:
                    self._on_line(instance, bytes(pending))
                    pending.clear()
            if pending:
                self._on_line(instance, bytes(pending))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            instance.drain_done.set()
            instance.first_news.set()

    def _on_line(self, instance: _Instance, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip()
        if not text:
            return
        self._options.log("INFO", "cloudflared", self._options.redact(text), None)
        event = parse_stderr_line(text)
        if event.rate_limited and instance.url is None:
            instance.rate_limited = True
            instance.first_news.set()
        elif event.url is not None and instance.url is None:
            instance.url = event.url
            instance.first_news.set()
        elif event.registered:
            instance.registered.set()
        elif event.metrics_address is not None:
            instance.metrics_ready = ready_url(event.metrics_address)

    async def _exit_code(self, instance: _Instance) -> str:
        with trio.move_on_after(2.0):
            await instance.process.wait()
        code = instance.process.returncode
        return "unknown" if code is None else str(code)

    async def _wait_ready(self, instance: _Instance) -> None:
        options = self._options
        deadline = trio.current_time() + options.start_timeout
        budget = f"{options.start_timeout:g}s"
        with trio.move_on_at(deadline):
            await instance.first_news.wait()
        if instance.rate_limited:
            raise TunnelRateLimited(RATE_LIMIT_MESSAGE)
        if instance.url is None:
            if instance.drain_done.is_set():
                code = await self._exit_code(instance)
                raise TunnelStartError(
                    f"cloudflared exited with code {code} before publishing a tunnel URL"
                )
            raise TunnelStartError(
                f"cloudflared did not publish a trycloudflare.com URL within {budget}; "
                "see the run log for its output"
            )
        # Probing a hostname before it is registered can get NXDOMAIN cached by resolvers.
        with trio.move_on_at(min(trio.current_time() + options.registration_grace, deadline)):
            await instance.registered.wait()
        if not instance.registered.is_set():
            await self._probe_or_registration(instance, deadline, budget)
        if instance.registered.is_set():
            await trio.sleep(options.stability_window)
            if instance.drain_done.is_set():
                code = await self._exit_code(instance)
                raise TunnelStartError(
                    f"cloudflared exited with code {code} before tunnel startup completed"
                )

    async def _probe_or_registration(
        self, instance: _Instance, deadline: float, budget: str
    ) -> None:
        """Race an HTTP probe of the public URL against the registration line (spec A.7 step 3)."""
        last_failure = "no probe answered yet"
        probe_error: TunnelError | None = None
        done = False

        async def probe(cancel: trio.CancelScope) -> None:
            nonlocal last_failure, probe_error, done
            assert instance.url is not None
            while True:
                if instance.process.returncode is not None or instance.drain_done.is_set():
                    code = await self._exit_code(instance)
                    probe_error = TunnelStartError(
                        f"cloudflared exited with code {code} before the tunnel became reachable"
                    )
                    break
                failure = await self._probe(self._public, instance.url, healthy_below=500)
                if failure is None:
                    instance.public_probe_ok = True
                    break
                last_failure = failure
                await trio.sleep(self._options.probe_interval)
            done = True
            cancel.cancel()

        async def registration(cancel: trio.CancelScope) -> None:
            await instance.registered.wait()
            await trio.lowlevel.checkpoint()  # let a probe finishing in the same tick win
            if not done:
                cancel.cancel()

        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe, nursery.cancel_scope)
                nursery.start_soon(registration, nursery.cancel_scope)
        if probe_error is not None:
            raise probe_error
        if not done and not instance.registered.is_set():
            raise TunnelStartError(
                "cloudflared published a tunnel URL, but it neither registered a connection nor "
                f"passed this host's readiness check within {budget}; last readiness failure: "
                f"{last_failure}. Retry, or run your own tunnel and pass --advertise-url. "
                f"Quick-tunnel documentation: {_QUICK_TUNNEL_DOCS}"
            )

    async def _probe(
        self, client: httpx.AsyncClient, url: str, *, healthy_below: int
    ) -> str | None:
        """GET ``url``; None when the status is below ``healthy_below``, else why not (one line)."""
        try:
            response = await client.get(url)
        except httpx.HTTPError as exc:
            detail = str(exc).splitlines()[0] if str(exc) else ""
            return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        await response.aclose()
        if response.status_code < healthy_below:
            return None
        return f"HTTP {response.status_code}"

    async def _watch(self, instance: _Instance) -> str:
        """Return why the tunnel stopped working: the process exited or stopped answering."""
        reason = ""

        async def exited(cancel: trio.CancelScope) -> None:
            nonlocal reason
            code = await instance.process.wait()
            reason = reason or f"the cloudflared tunnel exited with code {code}"
            cancel.cancel()

        async def unanswered(cancel: trio.CancelScope) -> None:
            nonlocal reason
            detail = await self._health_loop(instance)
            reason = reason or f"the cloudflared tunnel stopped answering ({detail})"
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(exited, nursery.cancel_scope)
            nursery.start_soon(unanswered, nursery.cancel_scope)
        return reason

    async def _health_loop(self, instance: _Instance) -> str:
        """Probe until ``health_failures`` misses in a row; return the last miss."""
        options = self._options
        misses = 0
        while True:
            await trio.sleep(options.health_interval)
            if instance.metrics_ready is not None:
                failure = await self._probe(self._local, instance.metrics_ready, healthy_below=300)
            elif instance.public_probe_ok and instance.url is not None:
                # Only when this host has reached the public URL before: a host whose DNS or
                # proxy cannot resolve trycloudflare.com must not restart a working tunnel.
                failure = await self._probe(self._public, instance.url, healthy_below=500)
            else:
                await trio.sleep_forever()
            if failure is None:
                misses = 0
                continue
            misses += 1
            if misses >= options.health_failures:
                return failure

    async def _stop(self, instance: _Instance) -> None:
        """Stop the process through the owner; release it only once it is confirmed gone."""
        options = self._options
        process = instance.process
        confirmed = await self._owner.stop(process, options.stop_grace)
        self._state.stop_confirmed = confirmed
        if confirmed:
            await trio.to_thread.run_sync(self._owner.release, process.pid)
        else:
            options.log(
                "WARNING",
                "tunnel",
                "cloudflared may still be running; leaving its ownership record for the next "
                "invocation to reap",
                {"pid": instance.process.pid},
            )

    # -- self-healing -------------------------------------------------------------------------

    async def heal(self, instance: _Instance) -> None:
        """Restart the tunnel whenever it is lost; return once it failed for good."""
        options = self._options
        state = self._state
        failed_attempts = 0
        while True:
            await instance.ended.wait()
            reason = instance.end_reason or "the cloudflared tunnel ended"
            state.lost()
            if trio.current_time() - instance.ready_at >= options.stable_after:
                failed_attempts = 0
            elif state.restarts > 0:
                failed_attempts += 1  # the last restart did not hold
            last_error = reason
            while True:
                if failed_attempts >= options.max_restarts:
                    self._give_up(reason, failed_attempts, last_error)
                    return
                attempt = failed_attempts + 1
                options.log(
                    "WARNING",
                    "tunnel",
                    f"{reason}; restarting it",
                    {"attempt": attempt, "max_attempts": options.max_restarts},
                )
                options.milestone(
                    f"{reason}; restarting it (attempt {attempt} of {options.max_restarts})"
                )
                await trio.sleep(min(options.restart_backoff * 2**failed_attempts, 30.0))
                try:
                    instance = await self._nursery.start(self.instance_main)
                except TunnelError as exc:
                    failed_attempts += 1
                    last_error = str(exc)
                    options.log(
                        "WARNING", "tunnel", "cloudflared restart failed", {"error": last_error}
                    )
                    continue
                break
            state.restarts += 1
            state.publish(instance.url or "", instance.process.pid)
            options.log(
                "INFO",
                "tunnel",
                "cloudflared tunnel restarted",
                {"url": state.url, "restarts": state.restarts},
            )
            options.milestone(
                f"tunnel ready again: {state.url} (restart {state.restarts}); "
                "rollouts dispatched from now on use it"
            )

    def _give_up(self, reason: str, failed_attempts: int, last_error: str) -> None:
        if failed_attempts == 0:
            message = f"{reason}; {UNREACHABLE_TAIL}"
        else:
            message = (
                f"{reason}; {failed_attempts} restart attempt(s) failed (last: {last_error}); "
                f"{UNREACHABLE_TAIL}"
            )
        self._options.log("ERROR", "tunnel", message, None)
        self._state.fail(message)
