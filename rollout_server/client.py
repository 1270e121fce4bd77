"""Async (trio + httpx) client of the long-poll rollout protocol (docs/spec/protocol.md §11).

One :class:`RolloutClient` per server; it shares one pooled :class:`httpx.AsyncClient` across
all calls (no connection limit, so every in-flight long-poll gets its own connection) and uses
an explicit timeout per call kind. The pool behind that client is split into
:data:`POOL_SHARDS` httpcore pools (least busy first): httpcore's pool bookkeeping costs
O(connections²) per request, which at 200 concurrent long-polls made the client, not the
server, the bottleneck (about 40 rollouts/s); spread over small pools it is noise::

    async with RolloutClient("http://127.0.0.1:8000") as client:
        health = await client.health()                  # Health: body, headers, capacity, ...
        admission = await client.admit(request)         # retries 429 per Retry-After
        result = await client.wait_for_result(admission, on_status=print)
        dispositions = await client.cancel(ids=[request.rollout_id])

Outcomes are typed:

* :class:`RolloutServerUnreachable` — transport failures (connection refused/reset, timeouts)
  after the protocol's retries: the server is gone or hung, not a protocol answer.
* :class:`RolloutProtocolError` (``status_code``, ``detail``) — the server answered something
  the protocol does not accept. Admission refusals are subclasses, one per status:
  :class:`RolloutIdConflict` (409), :class:`InvalidRolloutRequest` (422),
  :class:`ServerShuttingDown` (503), :class:`CapacityExhausted` (429, ``retry_after``; only from
  :meth:`RolloutClient.admit_once`), :class:`AdmissionRejected` for any other code.
* :class:`RolloutAdmissionTimeout` (a ``TimeoutError``) — 429s did not clear in time.

Retry rules. The 429, transport and gateway rules follow the reference client; the
connect-phase rule is this client's own and is off unless the caller passes ``server_alive`` (a check that the server
process still runs, for a caller that owns it)::

    admit_once        no retries
    admit             429            sleep Retry-After, clamped to [0.05, 60] s (1 s when absent)
                      connect phase  sleep 0.05 s, doubling to 2 s         (with server_alive)
                      ... both only within the admission deadline
    poll_once         transport      0.1 s, 0.5 s
                      502/503/504    0.25, 0.5, 1, 2, 4, 8 s
                      ... never past the client's lease deadline
    wait_for_result   connect phase  sleep 0.05 s, doubling to 2 s         (with server_alive)
                      ... only while now + delay + 1 s < the lease deadline

Every call reads one reply type (:class:`~rollout_server.net.reply.Reply`) and fails with
one vocabulary (:mod:`rollout_server.net.wireerrors`, the ``__cause__`` of a
:class:`RolloutServerUnreachable`) whichever way it went: the lean pool or httpx.
A connect-phase failure is one caused by :class:`~rollout_server.net.wireerrors.NotSent`
(``ConnectFailed``, ``ConnectTimeout``): the request never left, so sending it again cannot
admit twice (a busy server's full listen backlog looks like this). It is retried only while
``server_alive()`` holds; otherwise, and once a bound is reached, it is raised as
:class:`RolloutServerUnreachable`.

Why one module of this size: every retry rule (429 with ``Retry-After``, gateway answers,
connect-phase failures) composes with the others inside the same calls; the table above is
only true if the code that implements it sits next to it.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import httpx
import msgspec
import trio

from .client_errors import (
    AdmissionRejected,
    CapacityExhausted,
    InvalidRolloutRequest,
    RolloutAdmissionTimeout,
    RolloutClientError,
    RolloutIdConflict,
    RolloutProtocolError,
    RolloutServerUnreachable,
    ServerShuttingDown,
    UnsendableRequest,
    encode_request,
)
from .net.h1client import H1Pool
from .net.httpclient import ShardedTransport, send_whole, skip_empty_cookies
from .net.reply import Reply
from .net.wireerrors import ConnectFailed, ConnectionLost, NotSent, ReadTimeout, WireError
from .protocol import (
    LEASE_HEADER,
    CancelDisposition,
    HealthReport,
    RolloutInitRequest,
    RolloutResultResponse,
    decode_cancel_response,
    decode_init_response,
    decode_result_response,
)

__all__ = [
    "Admission",
    "AdmissionRejected",
    "CapacityExhausted",
    "Health",
    "InvalidRolloutRequest",
    "RolloutAdmissionTimeout",
    "RolloutClient",
    "RolloutClientError",
    "RolloutIdConflict",
    "RolloutProtocolError",
    "RolloutServerUnreachable",
    "ServerShuttingDown",
    "UnsendableRequest",
]

_TRANSPORT_RETRY_DELAYS = (0.1, 0.5)
_GATEWAY_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_GATEWAY_STATUSES = frozenset({502, 503, 504})
# The failures poll_once retries: all but a connect timeout and a local failure (the rule
# kept from the httpx days, when these were httpx's NetworkError, ReadTimeout and
# RemoteProtocolError).
_RETRIED_TRANSPORT = (ConnectFailed, ConnectionLost, ReadTimeout)
_CONNECT_RETRY_FIRST = 0.05
_CONNECT_RETRY_MAX = 2.0
_CONNECT_RETRY_LEASE_MARGIN = 1.0
_encode = msgspec.json.Encoder().encode
_JSON = {"Content-Type": "application/json"}


POOL_SHARDS = 64

# Path characters that need no percent-encoding (RFC 3986 pchar and "/").
_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*")
_PROXY_VARIABLES = ("http_proxy", "all_proxy")


def _lean_pool(url: httpx.URL) -> H1Pool | None:
    """The lean pool for the admission and the long-poll, when ``url`` allows one: plain HTTP
    and no proxy configured in the environment (those go through httpx, which honours them)."""
    if url.scheme != "http" or not url.host:
        return None
    names = {name.lower() for name in os.environ}
    if any(variable in names for variable in _PROXY_VARIABLES):
        return None
    return H1Pool(url.host, url.port or 80)


_ADMISSION_ERRORS: dict[int, type[AdmissionRejected]] = {
    409: RolloutIdConflict,
    422: InvalidRolloutRequest,
    503: ServerShuttingDown,
}


@dataclass
class Admission:
    """An admitted rollout: what polling needs."""

    rollout_id: str
    token: str
    result_wait_timeout_sec: float
    polling_lease_timeout_sec: float
    lease_deadline: float
    """``trio.current_time()`` by which the next poll must arrive (client's view)."""


@dataclass(frozen=True, kw_only=True)
class Health(HealthReport):
    """A ``/health`` answer: the :class:`~rollout_server.protocol.HealthReport` plus the
    response's status code and headers (by lower-case name)."""

    status_code: int = 200
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_response(cls, response: Reply) -> Health | None:
        """Read ``response``; None when its body is not a JSON object."""
        headers = response.header_map()
        report = HealthReport.from_json(response.body, headers)
        if report is None:
            return None
        values = {f.name: getattr(report, f.name) for f in fields(HealthReport)}
        return cls(**values, status_code=response.status, headers=headers)


def _detail(response: Reply) -> Any:
    try:
        body = response.json()
    except ValueError:
        return response.text()[:500]
    return body.get("detail") if isinstance(body, dict) else body


def _unreachable(method: str, path: str, exc: WireError) -> RolloutServerUnreachable:
    return RolloutServerUnreachable(f"{method} {path}: {type(exc).__name__}: {exc or 'no details'}")


def _retry_after(value: str | None) -> float:
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        seconds = 1.0
    if not math.isfinite(seconds):
        seconds = 1.0
    return min(max(seconds, 0.05), 60.0)


StatusCallback = Callable[[RolloutResultResponse], Awaitable[None] | None]


def _never_sent(exc: BaseException) -> bool:
    """True when a transport failure happened before the request left (connect phase)."""
    return isinstance(exc.__cause__, NotSent)


class _ConnectBackoff:
    """The connect-phase retry's delays: 0.05 s, doubling to at most 2 s."""

    def __init__(self) -> None:
        self.delay = _CONNECT_RETRY_FIRST

    async def sleep(self) -> None:
        await trio.sleep(self.delay)
        self.delay = min(self.delay * 2, _CONNECT_RETRY_MAX)


class RolloutClient:
    """Client of one rollout server at ``url``.

    ``http_client`` lets callers share a pool (then :meth:`aclose` leaves it open).
    ``admission_timeout_sec`` bounds :meth:`admit` (``None``: wait forever).
    ``server_alive`` turns on the connect-phase retry of :meth:`admit` and
    :meth:`wait_for_result` (module docstring); ``None`` leaves it off.

    Without ``http_client``, the two calls made per rollout (admission and long-poll) and
    ``/health`` to a plain-HTTP server go through :class:`~rollout_server.net.h1client.H1Pool`,
    several times cheaper per call than httpx; the other calls, and every call to an HTTPS
    server or through a proxy, go through httpx. Either way a call reads a
    :class:`~rollout_server.net.reply.Reply` or fails with a
    :mod:`~rollout_server.net.wireerrors` type.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        admission_timeout_sec: float | None = None,
        connect_timeout_sec: float = 5.0,
        health_timeout_sec: float = 5.0,
        admission_request_timeout_sec: float = 30.0,
        cancel_timeout_sec: float = 5.0,
        server_alive: Callable[[], bool] | None = None,
    ) -> None:
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key must be a non-blank string")
        if admission_timeout_sec is not None and not math.isfinite(admission_timeout_sec):
            raise ValueError("admission_timeout_sec must be finite")
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = http_client is None
        self._given_http = http_client
        parsed = httpx.URL(self.url)
        self._lean = _lean_pool(parsed) if http_client is None else None
        self._prefix = parsed.raw_path.rstrip(b"/")
        self._lean_headers = [(b"authorization", f"Bearer {api_key}".encode())] if api_key else []
        self.admission_timeout_sec = admission_timeout_sec
        self._connect = connect_timeout_sec
        self._health_timeout = httpx.Timeout(health_timeout_sec)
        self._admission_timeout = httpx.Timeout(
            admission_request_timeout_sec, connect=connect_timeout_sec
        )
        self._cancel_timeout_sec = cancel_timeout_sec
        self._server_alive = server_alive
        self.admission_headers: dict[str, str] = {}  # added to every POST /rollout

    @functools.cached_property
    def _http(self) -> httpx.AsyncClient:
        """The httpx client: the one given, else one made at its first use. A local run needs
        none (every call it makes to a plain-HTTP server goes through the lean pool), and
        making one builds 64 transports and loads the CA bundle: 60-200 ms of CPU at start-up."""
        if self._given_http is not None:
            return self._given_http
        return skip_empty_cookies(
            httpx.AsyncClient(transport=ShardedTransport(POOL_SHARDS), follow_redirects=False)
        )

    async def aclose(self) -> None:
        """Close the pool (when this client created it)."""
        if self._owns_client and "_http" in self.__dict__:
            await self._http.aclose()
        if self._lean is not None:
            await self._lean.aclose()

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _send(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes | None,
        limits: httpx.Timeout,
        *,
        lean: bool = True,
    ) -> Reply:
        """One call, its answer read whole: through the lean pool when there is one (and
        ``lean``), else httpx. Raises a :mod:`~rollout_server.net.wireerrors` failure either
        way."""
        if self._lean is None or not lean:
            headers = {**self._headers, **headers}
            return await send_whole(self._http, method, self.url + path, headers, body, limits)
        if _PLAIN_PATH.fullmatch(path):
            target = self._prefix + path.encode("ascii")
        else:
            target = httpx.URL(self.url + path).raw_path
        return await self._lean.request(
            method.encode("ascii"),
            target,
            [*self._lean_headers, *((k.encode(), v.encode()) for k, v in headers.items())],
            body or b"",
            total_sec=limits.read if limits.read is not None else math.inf,
            connect_sec=limits.connect if limits.connect is not None else math.inf,
        )

    # -- health -------------------------------------------------------------------------

    async def health(self) -> Health:
        """``GET /health``; raises unless 200 with a JSON object."""
        try:
            response = await self._send("GET", "/health", {}, None, self._health_timeout)
        except WireError as exc:
            raise _unreachable("GET", "/health", exc) from exc
        if response.status != 200:
            raise RolloutProtocolError(
                f"GET /health returned {response.status}",
                status_code=response.status,
                detail=_detail(response),
            )
        health = Health.from_response(response)
        if health is None:
            raise RolloutProtocolError("GET /health did not return a JSON object", status_code=200)
        return health

    async def probe_chat_endpoint(
        self,
        *,
        nonce: str,
        expect: str | None,
        candidates: list[dict[str, str]],
        exclusive: bool,
        path: str = "/v1/rollbridge/probe-chat-endpoint",
        timeout_sec: float = 900.0,
    ) -> dict[str, Any] | None:
        """``POST`` the sandbox probe (rollout_server.probe_route): the report, or None when
        the server has no probe (404). ``timeout_sec`` bounds the whole call (the first probe
        may build the sandbox image); cancelling the caller interrupts it at once."""
        body = {"nonce": nonce, "expect": expect, "candidates": candidates, "exclusive": exclusive}
        limits = httpx.Timeout(timeout_sec, connect=self._connect)
        try:
            with trio.fail_after(timeout_sec):
                response = await self._send("POST", path, _JSON, _encode(body), limits, lean=False)
        except WireError as exc:
            raise _unreachable("POST", path, exc) from exc
        except trio.TooSlowError as exc:
            raise RolloutServerUnreachable(
                f"POST {path} did not answer within {timeout_sec:.0f} s"
            ) from exc
        if response.status == 404:
            return None
        report = _detail(response) if response.status != 200 else None
        if response.status != 200:
            raise RolloutProtocolError(
                f"POST {path} returned {response.status}: {report}",
                status_code=response.status,
                detail=report,
            )
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise RolloutProtocolError(f"POST {path} did not return a JSON object", status_code=200)
        return doc

    async def wait_idle(
        self,
        *,
        timeout_sec: float = 120.0,
        poll_interval_sec: float = 1.0,
        process_id: str | None = None,
    ) -> Health:
        """Poll ``/health`` until ``lifecycle.active_rollouts == 0`` (docs/spec/protocol.md §11.5).

        Keeps polling through transport errors and 408/429/5xx answers; raises
        :class:`RolloutProtocolError` when the server has no lifecycle identity or restarted
        (its ``process_id`` changed), and ``trio.TooSlowError`` after ``timeout_sec``.
        """
        with trio.fail_after(timeout_sec):
            while True:
                try:
                    health = await self.health()
                except RolloutServerUnreachable:
                    await trio.sleep(poll_interval_sec)
                    continue
                except RolloutProtocolError as exc:
                    if exc.status_code not in {408, 429, 500, 502, 503, 504}:
                        raise
                    await trio.sleep(poll_interval_sec)
                    continue
                current = health.process_id
                if current is None:
                    raise RolloutProtocolError("Server has no lifecycle identity", status_code=200)
                if process_id is not None and current != process_id:
                    raise RolloutProtocolError("Server restarted while waiting", status_code=200)
                process_id = current
                if health.accepting_rollouts is None or health.active_rollouts is None:
                    raise RolloutProtocolError(
                        "Server has no valid lifecycle state", status_code=200
                    )
                if health.active_rollouts == 0:
                    return health
                await trio.sleep(poll_interval_sec)

    # -- admission ----------------------------------------------------------------------

    async def admit_once(self, request: RolloutInitRequest) -> Admission:
        """One ``POST /rollout``. 429 raises :class:`CapacityExhausted`.

        The request is first checked with the server's own rules
        (:class:`~rollout_server.protocol.RequestValidationError`, nothing sent).
        """
        request.validate()
        body = encode_request(request)
        sent_at = trio.current_time()
        try:
            response = await self._send(
                "POST",
                "/rollout",
                {**_JSON, **self.admission_headers},
                body,
                self._admission_timeout,
            )
        except WireError as exc:
            raise _unreachable("POST", "/rollout", exc) from exc
        status = response.status
        if status == 429:
            raise CapacityExhausted(
                "POST /rollout returned 429",
                retry_after=_retry_after(response.header("retry-after")),
                detail=_detail(response),
            )
        if status != 202:
            error = _ADMISSION_ERRORS.get(status, AdmissionRejected)
            raise error(
                f"POST /rollout returned {status}; only 202 and 429 are accepted",
                status_code=status,
                detail=_detail(response),
            )
        try:
            accepted = decode_init_response(response.body)
        except msgspec.MsgspecError as exc:
            raise RolloutProtocolError(
                f"POST /rollout: invalid 202 body: {exc}", status_code=202
            ) from exc
        if accepted.rollout_id != request.rollout_id:
            raise RolloutProtocolError(
                f"POST /rollout: server echoed rollout_id {accepted.rollout_id!r}, "
                f"expected {request.rollout_id!r}",
                status_code=202,
            )
        return Admission(
            rollout_id=accepted.rollout_id,
            token=accepted.polling_lease_token,
            result_wait_timeout_sec=accepted.result_wait_timeout_sec,
            polling_lease_timeout_sec=accepted.polling_lease_timeout_sec,
            lease_deadline=sent_at + accepted.polling_lease_timeout_sec,
        )

    def _retries_connect(
        self, exc: RolloutServerUnreachable, next_attempt_at: float, by: float
    ) -> bool:
        """Whether the connect-phase rule resends after ``exc`` (next attempt before ``by``)."""
        return (
            self._server_alive is not None
            and _never_sent(exc)
            and self._server_alive()
            and next_attempt_at < by
        )

    async def admit(
        self, request: RolloutInitRequest, *, admission_timeout_sec: float | None = None
    ) -> Admission:
        """Admit ``request``, retrying 429 per ``Retry-After`` (and connect failures, with
        ``server_alive``) until admitted or timed out."""
        limit = (
            self.admission_timeout_sec if admission_timeout_sec is None else admission_timeout_sec
        )
        budget = math.inf if limit is None else limit
        deadline = trio.current_time() + budget
        backoff = _ConnectBackoff()
        in_flight = False
        try:
            with trio.fail_after(budget):
                while True:
                    in_flight = True
                    try:
                        return await self.admit_once(request)
                    except CapacityExhausted as exc:
                        in_flight = False
                        await trio.sleep(exc.retry_after)
                    except RolloutServerUnreachable as exc:
                        in_flight = False
                        now = trio.current_time()
                        if not self._retries_connect(exc, now + backoff.delay, deadline):
                            raise
                        await backoff.sleep()
        except trio.TooSlowError:
            note = (
                " (a POST was in flight: the rollout may have been admitted)" if in_flight else ""
            )
            raise RolloutAdmissionTimeout(
                f"admission of {request.rollout_id} timed out after {limit}s{note}",
                maybe_admitted=in_flight,
            ) from None

    # -- results ------------------------------------------------------------------------

    async def poll_once(self, admission: Admission) -> RolloutResultResponse:
        """One result read (a long-poll), with the protocol's retries; renews the lease."""
        path = f"/rollout/{admission.rollout_id}/result"
        request_timeout = admission.result_wait_timeout_sec + 10.0
        timeout = httpx.Timeout(request_timeout, connect=self._connect)
        transport_delays = list(_TRANSPORT_RETRY_DELAYS)
        gateway_delays = list(_GATEWAY_RETRY_DELAYS)
        first_failure = True
        while True:
            sent_at = trio.current_time()
            cap = math.inf if first_failure else admission.lease_deadline
            error: BaseException
            try:
                with trio.fail_at(cap):
                    response = await self._send(
                        "GET", path, {LEASE_HEADER: admission.token}, None, timeout
                    )
            except _RETRIED_TRANSPORT as exc:
                error, delays = exc, transport_delays
            except WireError as exc:
                raise RolloutServerUnreachable(f"GET {path}: {type(exc).__name__}") from exc
            except trio.TooSlowError as exc:
                raise RolloutServerUnreachable(
                    f"GET {path}: no answer before the polling lease deadline"
                ) from exc
            else:
                if response.status == 200:
                    return self._parse_result(response, admission, sent_at)
                if response.status not in _GATEWAY_STATUSES:
                    raise RolloutProtocolError(
                        f"GET {path} returned {response.status}",
                        status_code=response.status,
                        detail=_detail(response),
                    )
                error = RolloutProtocolError(
                    f"GET {path} returned {response.status}",
                    status_code=response.status,
                    detail=_detail(response),
                )
                delays = gateway_delays
            first_failure = False
            now = trio.current_time()
            if not delays or now + delays[0] + request_timeout >= admission.lease_deadline:
                raise _as_client_error(error, path) from error
            await trio.sleep(delays.pop(0))
            if trio.current_time() + request_timeout >= admission.lease_deadline:
                raise _as_client_error(error, path) from error

    def _parse_result(
        self, response: Reply, admission: Admission, sent_at: float
    ) -> RolloutResultResponse:
        try:
            result = decode_result_response(response.body)
        except msgspec.MsgspecError as exc:
            raise RolloutProtocolError(
                f"GET /rollout/{admission.rollout_id}/result: invalid body: {exc}", status_code=200
            ) from exc
        if result.rollout_id != admission.rollout_id:
            raise RolloutProtocolError(
                f"result for {result.rollout_id!r} returned for {admission.rollout_id!r}",
                status_code=200,
            )
        admission.lease_deadline = sent_at + admission.polling_lease_timeout_sec
        return result

    async def wait_for_result(
        self, admission: Admission, *, on_status: StatusCallback | None = None
    ) -> RolloutResultResponse:
        """Long-poll until terminal. ``on_status`` (sync or async) sees every status change.

        With ``server_alive``, a poll that failed while connecting is sent again while the
        attempt leaves a second before the lease deadline (module docstring).
        """
        last = None
        backoff = _ConnectBackoff()
        while True:
            try:
                result = await self.poll_once(admission)
            except RolloutServerUnreachable as exc:
                next_attempt_at = trio.current_time() + backoff.delay + _CONNECT_RETRY_LEASE_MARGIN
                if not self._retries_connect(exc, next_attempt_at, admission.lease_deadline):
                    raise
                await backoff.sleep()
                continue
            if result.status != last:
                last = result.status
                if on_status is not None:
                    outcome = on_status(result)
                    if inspect.isawaitable(outcome):
                        await outcome
            if result.is_terminal:
                return result

    async def run_rollout(
        self, request: RolloutInitRequest, *, on_status: StatusCallback | None = None
    ) -> RolloutResultResponse:
        """Admit, then wait for the terminal result."""
        admission = await self.admit(request)
        return await self.wait_for_result(admission, on_status=on_status)

    # -- cancel -------------------------------------------------------------------------

    async def cancel(
        self, ids: list[str] | None = None, *, prefix: str | None = None, all: bool = False
    ) -> dict[str, CancelDisposition]:
        """``POST /rollout/cancel`` with exactly one selector; dispositions by id (≤ 5 s)."""
        if (ids is not None) + (prefix is not None) + bool(all) != 1:
            raise ValueError("pass exactly one selector: ids, prefix, or all")
        body = {"ids": ids, "prefix": prefix, "all": all}
        path, limits = "/rollout/cancel", httpx.Timeout(self._cancel_timeout_sec)
        try:
            with trio.fail_after(self._cancel_timeout_sec):
                response = await self._send("POST", path, _JSON, _encode(body), limits, lean=False)
        except WireError as exc:
            raise _unreachable("POST", path, exc) from exc
        except trio.TooSlowError as exc:
            raise RolloutServerUnreachable("POST /rollout/cancel timed out") from exc
        if response.status != 200:
            raise RolloutProtocolError(
                f"POST /rollout/cancel returned {response.status}",
                status_code=response.status,
                detail=_detail(response),
            )
        try:
            return dict(decode_cancel_response(response.body).dispositions)
        except msgspec.MsgspecError as exc:
            raise RolloutProtocolError(
                f"POST /rollout/cancel: invalid body: {exc}", status_code=200
            ) from exc


def _as_client_error(error: BaseException, path: str) -> RolloutClientError:
    if isinstance(error, RolloutClientError):
        return error
    return RolloutServerUnreachable(f"GET {path}: {type(error).__name__}: {error or 'no details'}")
