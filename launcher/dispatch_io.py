"""The dispatcher's real collaborators: the bridge as the model endpoint, the long-poll
client as the rollout transport, and the run directory as the result sink (see the seams in
:mod:`launcher.dispatch`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from bridge.bearers import rollout_bearer
from launcher.dispatch import LogFn, RolloutRefused
from launcher.report import describe
from launcher.resultwait import ResultWaiter
from launcher.rollout_child import RolloutServer
from launcher.rundir.calls import call_totals
from launcher.rundir.journal import ErrorInfo, TerminalRecord
from launcher.rundir.projections import load_failure_detail
from rollout_server.client import (
    Admission,
    AdmissionRejected,
    RolloutClient,
    RolloutServerUnreachable,
    UnsendableRequest,
)
from rollout_server.protocol import (
    RequestValidationError,
    RolloutInitRequest,
    RolloutResultResponse,
)

if TYPE_CHECKING:
    from bridge.calls import CallBook
    from bridge.server import BridgeService
    from launcher.rundir import RunDirectory
    from tunnel.cloudflared import TunnelHandle

__all__ = ["REVOKE_WAIT_S", "BridgeEndpoint", "RolloutClientTransport", "RunSink"]

#: The longest a revocation is waited for: the bridge's own wait for the calls it cancels
#: (bridge.revoke.SETTLE_S), and some.
REVOKE_WAIT_S = 10.0


class BridgeEndpoint:
    """The :class:`launcher.dispatch.ModelEndpoint` of a run: the bridge, reached directly,
    through the user's ``--advertise-url``, or through the managed tunnel.

    ``sandbox_routed``: the rollout server probed how its sandboxes reach the bridge
    (:mod:`launcher.sandbox_probe`) and maps loopback chat URLs to that route itself, so every
    chat URL it is given stays loopback."""

    def __init__(
        self,
        bridge: BridgeService,
        bearer: str,
        tunnel: TunnelHandle | None,
        advertise_url: str | None,
        *,
        sandbox_routed: bool = False,
    ) -> None:
        self._bridge = bridge
        self._bearer = bearer
        self._tunnel = tunnel
        self._advertise_url = advertise_url
        self._sandbox_routed = sandbox_routed

    def bearer_for(self, rollout_id: str) -> str:
        """The key the bridge accepts from ``rollout_id`` (its own: bridge.bearers)."""
        return rollout_bearer(self._bearer, rollout_id)

    def base_url(self) -> str:
        """The base the sandbox should use now: tunnel, advertised URL, else loopback."""
        if self._sandbox_routed:
            return self._bridge.base_url
        if self._tunnel is not None and self._tunnel.public_url:
            return self._tunnel.public_url
        if self._advertise_url:
            return self._advertise_url
        return self._bridge.base_url

    def chat_url(self, rollout_id: str) -> str:
        """The rollout's ``chat_completions_url`` (its id is in the path, for usage)."""
        return self._bridge.rollout_url(rollout_id, self.base_url())

    async def ready(self) -> None:
        """A restarting tunnel publishes its new URL before the next admission."""
        if self._tunnel is not None:
            await self._tunnel.wait_available()

    def take_usage(self, rollout_id: str) -> tuple[int | None, int | None, int | None]:
        """Pop the bridge's token counts and retries for a finished rollout (tokens stay
        unknown when the provider answered none of its calls)."""
        found = self._bridge.ledger.pop(rollout_id)
        if found is None:
            return None, None, None
        if not found.calls:
            return None, None, found.retries or None
        return found.total_tokens, found.max_context_tokens, found.retries or None

    def forget(self, rollout_id: str) -> None:
        """Drop the counts of a rollout that will not be recorded."""
        self._bridge.ledger.discard(rollout_id)
        self._bridge.calls.discard(rollout_id)

    async def revoke(self, rollout_id: str) -> None:
        """Have the bridge refuse ``rollout_id``'s calls from now on (bridge.revoke), and
        wait (bounded: a wedged bridge is reported by its own watch) until it does."""
        with trio.move_on_after(REVOKE_WAIT_S):
            await self._bridge.revoke(rollout_id)


_WAITERS: weakref.WeakKeyDictionary[RolloutClient, ResultWaiter] = weakref.WeakKeyDictionary()


class _AdmittedRollout:
    def __init__(
        self, client: RolloutClient, admission: Admission, results: ResultWaiter | None
    ) -> None:
        self._client = client
        self._admission = admission
        self._results = results
        self._registered = results is not None  # by its admission, until a first wait

    async def wait(self) -> RolloutResultResponse:
        if self._results is not None:
            registered, self._registered = self._registered, False
            return await self._results.wait(self._admission, registered=registered)
        return await self._client.wait_for_result(self._admission)


class RolloutClientTransport:
    """The :class:`launcher.dispatch.RolloutTransport` over the long-poll client.

    Retries (429, connect-phase failures while the server lives) are the client's; this adapter
    only turns a 4xx refusal, and a request that cannot be sent at all (a row holding text that
    is not valid Unicode, or breaking the protocol's rules), into :class:`RolloutRefused`, and
    names a dead server as the cause.

    Results come through the server's batched wait (:mod:`launcher.resultwait`: two
    connections at most, whatever the rollouts in flight) when the run chose it for this
    server (``server.batched_wait``), else through one long-poll per rollout.
    """

    def __init__(self, client: RolloutClient, server: RolloutServer) -> None:
        self._client = client
        self._server = server
        self.results: ResultWaiter | None = None
        if server.batched_wait:
            # One waiter per client: its admissions register their rollouts with it.
            self.results = _WAITERS.get(client)
            if self.results is None:
                child = server.child
                self.results = _WAITERS[client] = ResultWaiter(
                    server.base_url,
                    api_key=server.token,
                    server_alive=lambda: child.returncode is None,
                )
                client.admission_headers.update(self.results.admission_headers)

    async def admit(
        self, request: RolloutInitRequest, admission_timeout_s: float
    ) -> _AdmittedRollout:
        """``POST /rollout``; a 4xx other than 429, or a request that cannot be sent, is a
        refusal of this item."""
        try:
            admission = await self._client.admit(request, admission_timeout_sec=admission_timeout_s)
        except (UnsendableRequest, RequestValidationError) as exc:
            raise RolloutRefused(None, str(exc), kind=type(exc).__name__) from None
        except AdmissionRejected as exc:
            code = exc.status_code or 0
            if 400 <= code < 500 and code != 429:
                detail = f": {exc.detail}" if exc.detail else ""
                raise RolloutRefused(code, f"{exc}{detail}") from None
            raise
        return _AdmittedRollout(self._client, admission, self.results)

    async def cancel(self, rollout_id: str) -> None:
        """Ask the server to cancel one rollout."""
        await self._client.cancel([rollout_id])

    async def explain(self, exc: BaseException) -> str | None:
        """The server's exit as the cause of a transport failure (it may take a moment for the
        exit to be observable after its sockets closed), or, while it runs, that it does not
        answer (a workflow blocking its event loop, say): either way the items it holds will
        not end, so the halt cancels them rather than waiting out their deadlines."""
        if not isinstance(exc, RolloutServerUnreachable):
            return None
        with trio.move_on_after(1.0):
            code = await self._server.child.process.wait()
            return f"the rollout server exited with code {code}; see logs.txt"
        return f"the rollout server does not answer ({exc}); see logs.txt"


class RunSink:
    """The :class:`launcher.dispatch.ResultSink` of a run: a failure's reason completed from the
    rollout server's ``diagnostics.json`` and redacted, the journal (through the run
    directory), a ``work item failed`` log line with the reason, then ``progress``.

    ``calls``: the bridge's call records (bridge.calls.CallBook); a rollout's are taken
    with its result, their totals set on the record, and journaled with it."""

    def __init__(
        self,
        run_dir: RunDirectory,
        redact: Callable[[str], str],
        log: LogFn,
        progress: Callable[[str], None],
        on_halt: Callable[[str], None],
        calls: CallBook | None = None,
    ) -> None:
        self._calls = calls
        self._run_dir = run_dir
        self._redact = redact
        self._log = log
        self._progress = progress
        self._on_halt = on_halt

    async def record(self, record: TerminalRecord, *, has_sample: bool) -> None:
        """Complete and redact ``record.error``, journal the record, log a failure's reason."""
        if record.error is not None:
            record.error = await self._reason(record, record.error)
        calls = self._calls.pop(record.rollout_id) if self._calls is not None else None
        if calls:
            totals = call_totals(calls)
            record.calls = totals["calls"]
            record.cached_tokens = totals["cached_tokens"]
            record.cache_write_tokens = totals["cache_write_tokens"]
            record.reasoning_tokens = totals["reasoning_tokens"]
        try:
            await self._run_dir.record_result(record, wait_for_trajectory=has_sample, calls=calls)
        finally:
            # The result counts once journaled; a Ctrl-C during the projection work after
            # that must not leave the progress display one short of the journal.
            committed = self._run_dir.journal.latest.get(record.key)
            if committed is not None and committed.rollout_id == record.rollout_id:
                self._progress(describe(record))
        if record.status == "failed" and record.error is not None:
            self._log(
                "WARNING",
                "result",
                "work item failed",
                {
                    "error": record.error.to_json(),
                    "error_type": record.error_type,
                    "rollout_id": record.rollout_id,
                    "row_index": record.row_index,
                    "run_index": record.run_index,
                },
            )

    async def _reason(self, record: TerminalRecord, error: ErrorInfo) -> ErrorInfo:
        """``error`` with what the rollout server wrote about it in ``diagnostics.json`` (not
        for a refused admission or an expired lease: nothing the server wrote explains those),
        redacted with the run's redactor, then bounded."""
        if error.phase not in ("admission", "transport"):
            detail = await trio.to_thread.run_sync(
                load_failure_detail, self._run_dir.path / "rollout_trials", record.rollout_id
            )
            error = error.with_detail(detail)
        return error.redacted(self._redact)

    def halted(self, reason: str) -> None:
        """Dispatch stopped: tell the supervisor."""
        self._on_halt(reason)
