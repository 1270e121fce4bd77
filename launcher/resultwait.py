"""The supervisor's side of the rollout server's batched result wait (issue 29, item 1).

With the per-id long-poll (``RolloutClient.wait_for_result``) every rollout in flight holds a
connection to the rollout server, so the server holds two descriptors per rollout in flight
(that poll in, the rollout's model call out). A server whose ``/health`` lists
:data:`CAPABILITY` in ``rollbridge_capabilities`` also answers ``POST`` :data:`WAIT_ROUTE`
(rollout_server.resultwait, docs/spec/protocol.md §3.5): one wait for the results of many
rollouts. :class:`ResultWaiter` waits for every rollout of a run through it, over two
connections at most: one long wait (held up to the hold time, answered as soon as any result
is ready) and one short request that registers rollouts while the long wait is held. A
rollout admitted with :attr:`ResultWaiter.admission_headers` is registered by its admission
(no request of its own); only a rollout waited for again after its caller gave up (the
dispatcher's settling after a cancel) is registered by a request.

The long wait is sent, round after round while any rollout is waited for, by a task of the
waiter's own, a trio *system* task (``trio.lowlevel.spawn_system_task``): the dispatch's
transport has no nursery to offer, and a caller cannot run it, since handing the long wait
from caller to caller put a gap after every answer while the callers it had woken recorded
their results, which made the answers bursty and slowed a whole run down. The task catches
every failure (it hands it to the callers) and ends when nobody waits. A caller itself sends
only the short request. Cancelling a caller (its item's deadline, an interrupt) behaves as with
the per-id poll: only that caller stops waiting, and the rollout stays watched until the
dispatcher's cancel ends it.

Delivery is exactly once: the server answers a result in every wait until it is acknowledged
(in the next request), and a result whose caller is gone, or that came twice, is only
acknowledged. Failures follow the per-id poll's rules (rollout_server.client): transport
failures are retried after 0.1 and 0.5 s, 502/503/504 after 0.25 s doubling to 8 s, a request
that never left while the server process lives after 0.05 s doubling to 2 s, never past the
polling lease; then every waiting caller gets the error (``RolloutServerUnreachable``, or
``RolloutProtocolError`` for another answer). A rollout the server does not know (404) or whose
token it refuses (403) fails alone, as its per-id poll would.
"""

from __future__ import annotations

import itertools
import math
import os
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import httpx
import msgspec
import trio

from rollout_server.client import Admission, RolloutProtocolError, RolloutServerUnreachable
from rollout_server.net.h1client import H1Pool
from rollout_server.net.reply import Reply
from rollout_server.net.wireerrors import (
    ConnectFailed,
    ConnectionLost,
    NotSent,
    ReadTimeout,
    WireError,
)
from rollout_server.protocol import HealthReport, RolloutResultResponse

__all__ = [
    "BATCHED_ENV",
    "CAPABILITY",
    "WAIT_ROUTE",
    "ResultWaiter",
    "batched_wait_offered",
    "batched_wait_wanted",
]

#: The route and capability of rollout_server.resultwait (not imported: the launcher may only
#: use the client, protocol and net modules of rollout_server); a test keeps them equal.
WAIT_ROUTE: Final = "/v1/rollbridge/wait-results"
CAPABILITY: Final = "wait-results"
WAITER_HEADER: Final = "x-rollbridge-waiter"
#: ``ROLLBRIDGE_BATCHED_WAIT``: ``1`` waits through the batched wait wherever the server offers
#: it, ``0`` never; unset (or any other value), only when the run needs it, that is when the
#: rollouts in flight it asks for do not fit the open-file limit with one long-poll per rollout
#: (:func:`batched_wait_wanted`'s ``needed``; launcher.services decides it). Not the default
#: otherwise: it holds fewer sockets and less memory, but its end-to-end effect on a run's wall
#: is not settled (docs/performance.md, "The batched wait, measured").
BATCHED_ENV: Final = "ROLLBRIDGE_BATCHED_WAIT"
_MAX_IDS: Final = 4096
_MAX_RESULTS: Final = 1024
_REQUEST_MARGIN_SEC: Final = 10.0
_TRANSPORT_RETRY_DELAYS = (0.1, 0.5)
_GATEWAY_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_GATEWAY_STATUSES = frozenset({502, 503, 504})
# As the rollout client's long-poll: a refused connect, a lost connection or a stall is retried.
_RETRIED_TRANSPORT = (ConnectFailed, ConnectionLost, ReadTimeout)
_encode = msgspec.json.Encoder().encode


class _Answer(msgspec.Struct):
    results: list[RolloutResultResponse]
    rejected: dict[str, dict[str, Any]] = {}


_decode_answer = msgspec.json.Decoder(_Answer).decode


def batched_wait_offered(health: HealthReport) -> bool:
    """Whether the server's ``/health`` answer lists the batched wait."""
    capabilities = health.body.get("rollbridge_capabilities")
    return isinstance(capabilities, list) and CAPABILITY in capabilities


def batched_wait_wanted(health: HealthReport, *, needed: bool = False) -> bool:
    """Whether to wait through the batched wait: the server offers it, and :data:`BATCHED_ENV`
    asks for it (``1``), or leaves the choice to the run (unset) and ``needed`` says the
    per-id long-polls would not fit the open-file limit."""
    if not batched_wait_offered(health):
        return False
    choice = os.environ.get(BATCHED_ENV)
    return choice == "1" or (choice != "0" and needed)


class _Box:
    """One caller's rollout: its admission, then its result or error; ``turn`` wakes it."""

    __slots__ = ("admission", "error", "result", "turn")

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.result: RolloutResultResponse | None = None
        self.error: BaseException | None = None
        self.turn = trio.Event()

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class ResultWaiter:
    """Waits for the results of many rollouts of the server at ``url`` (plain HTTP) through
    its batched wait. ``server_alive`` as for :class:`~rollout_server.client.RolloutClient`."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        server_alive: Callable[[], bool] | None = None,
        connect_timeout_sec: float = 5.0,
    ) -> None:
        parsed = httpx.URL(url.rstrip("/"))
        if parsed.scheme != "http" or not parsed.host:
            raise ValueError(f"the batched wait needs a plain-HTTP server URL, not {url!r}")
        self._host, self._port = parsed.host, parsed.port or 80
        self._target = parsed.raw_path.rstrip(b"/") + WAIT_ROUTE.encode("ascii")
        self._headers = [(b"content-type", b"application/json")]
        if api_key:
            self._headers.append((b"authorization", f"Bearer {api_key}".encode()))
        self._server_alive = server_alive
        self._connect = connect_timeout_sec
        self._key = secrets.token_urlsafe(32)
        self._pool: H1Pool | None = None
        self._boxes: dict[str, _Box] = {}
        self._unsent: dict[str, str] = {}  # rollout id -> lease token, not yet registered
        self._acks: list[str] = []
        self._idle: deque[_Box] = deque()  # callers waiting for their turn
        self._long_busy = False
        self._short_busy = False
        self._looping = False
        self._hold = 30.0
        self._lease = 120.0
        self._renewed = -math.inf  # the latest lease renewal (client's view), for retries
        self.requests = 0
        """Requests sent (an observability counter)."""

    @property
    def admission_headers(self) -> dict[str, str]:
        """Headers that make an admission register its rollout with this waiter."""
        return {WAITER_HEADER: self._key}

    @property
    def connections(self) -> int:
        """Requests in flight right now: the connections held to the server (at most two)."""
        return self._long_busy + self._short_busy

    async def wait(
        self, admission: Admission, *, registered: bool = False
    ) -> RolloutResultResponse:
        """The terminal result of an admitted rollout (raises like ``poll_once``).
        ``registered``: it was admitted with :attr:`admission_headers`, and not waited for
        since."""
        rollout_id = admission.rollout_id
        box = self._boxes.get(rollout_id)
        if box is None:
            box = self._boxes[rollout_id] = _Box(admission)
            if not registered:
                self._unsent[rollout_id] = admission.token
            self._hold = admission.result_wait_timeout_sec
            self._lease = admission.polling_lease_timeout_sec
            sent_at = admission.lease_deadline - admission.polling_lease_timeout_sec
            self._renewed = max(self._renewed, sent_at)
        if not self._looping:
            self._looping = True
            trio.lowlevel.spawn_system_task(self._loop, name="rollbridge batched result wait")
        try:
            while not box.done:
                if self._unsent and not self._short_busy:
                    await self._round(long=False)
                else:
                    box.turn = trio.Event()
                    self._idle.append(box)
                    await box.turn.wait()
        finally:
            if self._boxes.get(rollout_id) is box:
                # Given up before its result (cancelled): still watched on the server until the
                # dispatcher's cancel ends it; its result is then only acknowledged.
                del self._boxes[rollout_id]
                self._unsent.pop(rollout_id, None)
            self._hand_over()
            await self._close_if_idle()
        if box.error is not None:
            raise box.error
        assert box.result is not None
        return box.result

    async def _loop(self) -> None:
        """The long wait, round after round, while any rollout is waited for."""
        try:
            while self._boxes:
                await self._round(long=True)
        except Exception as exc:  # a defect: fail the callers, not the whole trio run
            error = RolloutProtocolError(f"POST {WAIT_ROUTE}: {type(exc).__name__}: {exc}")
            for rollout_id in list(self._boxes):
                self._resolve(rollout_id, None, error)
        finally:
            self._looping = False
            await self._close_if_idle()

    async def _close_if_idle(self) -> None:
        """Close the connections once nobody waits and nothing is sent."""
        if not self._boxes and not self.connections and self._pool is not None:
            pool, self._pool = self._pool, None
            with trio.CancelScope(shield=True):
                await pool.aclose()

    def _hand_over(self) -> None:
        """Wake one waiting caller when rollouts need registering and nobody is sending them."""
        if not self._unsent or self._short_busy:
            return
        while self._idle:
            box = self._idle.popleft()
            if not box.done and self._boxes.get(box.admission.rollout_id) is box:
                box.turn.set()
                return

    def _resolve(self, rollout_id: str, result: RolloutResultResponse | None, error: Any) -> None:
        box = self._boxes.pop(rollout_id, None)
        self._unsent.pop(rollout_id, None)
        if box is None:
            return
        box.result, box.error = result, error
        box.turn.set()

    async def _round(self, *, long: bool) -> None:
        """One request: register what is unsent, acknowledge what came, collect results."""
        adds = _take(self._unsent, _MAX_IDS)
        acks, self._acks = self._acks[:_MAX_IDS], self._acks[_MAX_IDS:]
        body = _encode(
            {
                "waiter": self._key,
                "add": adds,
                "ack": acks,
                "timeout_sec": self._hold if long else 0,
                "max_results": _MAX_RESULTS,
            }
        )
        if long:
            self._long_busy = True
        else:
            self._short_busy = True
        try:
            reply, sent_at = await self._send(body)
            answer = _decode_answer(reply.body)
        except (RolloutServerUnreachable, RolloutProtocolError, msgspec.MsgspecError) as exc:
            error = (
                exc
                if not isinstance(exc, msgspec.MsgspecError)
                else RolloutProtocolError(
                    f"POST {WAIT_ROUTE}: invalid body: {exc}", status_code=200
                )
            )
            for rollout_id in list(self._boxes):
                self._resolve(rollout_id, None, error)
            return
        except BaseException:
            # Cancelled with the request unanswered: what it carried goes in the next one.
            for rollout_id, token in adds.items():
                if rollout_id in self._boxes:
                    self._unsent.setdefault(rollout_id, token)
            self._acks.extend(acks)
            raise
        finally:
            if long:
                self._long_busy = False
            else:
                self._short_busy = False
        self._renewed = max(self._renewed, sent_at)
        self._deliver(answer)

    def _deliver(self, answer: _Answer) -> None:
        for result in answer.results:
            self._acks.append(result.rollout_id)
            if result.is_terminal:
                self._resolve(result.rollout_id, result, None)
        for rollout_id, refusal in answer.rejected.items():
            status = refusal.get("status")
            code = status if isinstance(status, int) else 0
            error = RolloutProtocolError(
                f"GET /rollout/{rollout_id}/result returned {code}",
                status_code=code,
                detail=refusal.get("detail"),
            )
            self._resolve(rollout_id, None, error)

    async def _send(self, body: bytes) -> tuple[Reply, float]:
        """``POST`` the wait with the per-id poll's retries; the answer and its send time."""
        if self._pool is None:
            self._pool = H1Pool(self._host, self._port)
        pool = self._pool
        request_timeout = self._hold + _REQUEST_MARGIN_SEC
        transport_delays = list(_TRANSPORT_RETRY_DELAYS)
        gateway_delays = list(_GATEWAY_RETRY_DELAYS)
        connect_delay = 0.05
        while True:
            self.requests += 1
            sent_at = trio.current_time()
            lease_deadline = self._renewed + self._lease
            error: BaseException
            try:
                reply = await pool.request(
                    b"POST",
                    self._target,
                    self._headers,
                    body,
                    total_sec=request_timeout,
                    connect_sec=self._connect,
                )
            except _RETRIED_TRANSPORT as exc:
                error, delays = exc, transport_delays
            except WireError as exc:
                never_sent = isinstance(exc, NotSent)
                alive = self._server_alive is not None and self._server_alive()
                if never_sent and alive and sent_at + connect_delay + 1.0 < lease_deadline:
                    await trio.sleep(connect_delay)
                    connect_delay = min(connect_delay * 2, 2.0)
                    continue
                raise RolloutServerUnreachable(f"POST {WAIT_ROUTE}: {type(exc).__name__}") from exc
            else:
                if reply.status == 200:
                    return reply, sent_at
                error = RolloutProtocolError(
                    f"POST {WAIT_ROUTE} returned {reply.status}",
                    status_code=reply.status,
                    detail=_detail(reply),
                )
                if reply.status not in _GATEWAY_STATUSES:
                    raise error
                delays = gateway_delays
            now = trio.current_time()
            if not delays or now + delays[0] + request_timeout >= lease_deadline:
                raise _unreachable(error)
            await trio.sleep(delays.pop(0))


def _take(pending: dict[str, str], limit: int) -> dict[str, str]:
    """The first ``limit`` entries of ``pending``, removed from it."""
    if len(pending) <= limit:
        taken = dict(pending)
        pending.clear()
        return taken
    taken = dict(itertools.islice(pending.items(), limit))
    for rollout_id in taken:
        del pending[rollout_id]
    return taken


def _detail(reply: Reply) -> Any:
    try:
        body = msgspec.json.decode(reply.body)
    except msgspec.DecodeError:
        return reply.body.decode("utf-8", "replace")[:500]
    return body.get("detail") if isinstance(body, dict) else body


def _unreachable(error: BaseException) -> BaseException:
    if isinstance(error, RolloutProtocolError):
        return error
    return RolloutServerUnreachable(
        f"POST {WAIT_ROUTE}: {type(error).__name__}: {error or 'no details'}"
    )
