"""``POST /v1/rollbridge/wait-results``: one long-poll for the results of many rollouts.

The per-id long-poll (docs/spec/protocol.md §3.3) holds one connection per rollout in flight,
in the client and in the server. This route lets a client that knows it (``/health`` lists
:data:`CAPABILITY` in ``rollbridge_capabilities``) wait for all of its rollouts through one
connection. It sits beside the per-id poll, which is unchanged, under the ``/v1/rollbridge/``
prefix of this project's own routes (like the sandbox probe), so no route of the reference
protocol is shadowed. The contract (docs/spec/protocol.md §3.5):

* A *waiter* is named by a secret the client chooses (``waiter``). An admission that carries
  it in :data:`WAITER_HEADER` is watched by that waiter from its 202 on (the cheap way: no
  request of its own). ``add`` maps other rollout ids to their lease tokens: each is authenticated as a poll would be (404 ``unknown rollout_id`` is
  checked before 403 ``invalid polling lease``; those come back per id in ``rejected``, in the
  per-id poll's error shape) and its lease renewed, and the waiter then *watches* it.
* Every wait renews the leases of the rollouts its waiter watches (at most once a second), as
  the arrival of a poll for each would, so a client that stops waiting loses them to the lease.
* The answer comes as soon as one result is ready, with every ready result (at most
  ``max_results``), or with none after ``timeout_sec`` (at most the hold time) or when the
  server stops. A result body is exactly the per-id poll's final body.
* A result is answered again in every wait until the client lists its id in ``ack``: a result
  lost with its answer is never lost for good, and the client delivers each result once.
  ``ack`` also stops watching an id still running (a client that gave up on it).
* Only final results come back here; status changes in between are the per-id poll's.

A waiter nobody waited on for the lease time is forgotten. Bodies are bounded
(:data:`MAX_BODY_BYTES`, :data:`MAX_IDS` ids per list); bad input is 422 with a one-line
``detail``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any, Final, TypeGuard

import msgspec
import trio

from .service import LeaseMismatch, RolloutService, UnknownRollout

__all__ = [
    "CAPABILITY",
    "MAX_BODY_BYTES",
    "MAX_IDS",
    "MAX_RESULTS",
    "WAITER_HEADER",
    "WAIT_ROUTE",
    "ResultWaits",
    "WaitRequestError",
    "valid_waiter",
]

WAIT_ROUTE: Final = "/v1/rollbridge/wait-results"
CAPABILITY: Final = "wait-results"
WAITER_HEADER: Final = "x-rollbridge-waiter"
#: Ids in ``add`` and in ``ack``, each, per request.
MAX_IDS: Final = 4096
#: Results per answer (a request may ask for fewer).
MAX_RESULTS: Final = 1024
MAX_BODY_BYTES: Final = 2 * 1024 * 1024
_WAITER = re.compile(r"[A-Za-z0-9_-]{16,128}")
_RENEW_EVERY = 1.0
_encode = msgspec.json.Encoder().encode


class WaitRequestError(ValueError):
    """A wait request body without the documented shape (one-line message)."""


class _Waiter:
    __slots__ = ("parked", "ready", "renewed", "seen", "wakeup", "watched")

    def __init__(self, now: float) -> None:
        self.watched: set[str] = set()
        self.ready: dict[str, bytes] = {}  # final and not yet acknowledged, in arrival order
        self.wakeup = trio.Event()
        self.seen = now
        self.renewed = now
        self.parked = 0

    def wake(self) -> None:
        self.wakeup.set()
        self.wakeup = trio.Event()


def valid_waiter(key: object) -> TypeGuard[str]:
    """Whether ``key`` is a waiter's name: 16-128 characters of ``A-Z a-z 0-9 _ -``."""
    return isinstance(key, str) and _WAITER.fullmatch(key) is not None


def _ids(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_IDS:
        raise WaitRequestError(f"{where} must be a list of at most {MAX_IDS} rollout ids")
    if not all(isinstance(item, str) and item for item in value):
        raise WaitRequestError(f"{where} must hold non-empty strings")
    return value


def _adds(value: Any) -> Mapping[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_IDS:
        raise WaitRequestError(f"add must map at most {MAX_IDS} rollout ids to lease tokens")
    if not all(isinstance(token, str) and token for token in value.values()):
        raise WaitRequestError("add must map rollout ids to non-empty lease tokens")
    return value


def _number(value: Any, where: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WaitRequestError(f"{where} must be a finite number")
    return float(value)


class ResultWaits:
    """The waiters of one :class:`~rollout_server.service.RolloutService` (it tells them of
    every final result: they become its ``result_listener``)."""

    def __init__(self, service: RolloutService) -> None:
        self.service = service
        self._waiters: dict[bytes, _Waiter] = {}
        self._watchers: dict[str, list[_Waiter]] = {}
        self._collected = -math.inf
        service.result_listener = self

    @property
    def waiting(self) -> int:
        """Waits parked right now (an observability counter, like ``waiting_polls``)."""
        return sum(waiter.parked for waiter in self._waiters.values())

    # -- the service's listener ---------------------------------------------------------

    def finalized(self, rollout_id: str, body: bytes) -> None:
        """A result became final: hand it to the waiters watching it."""
        for waiter in self._watchers.pop(rollout_id, ()):
            waiter.watched.discard(rollout_id)
            waiter.ready[rollout_id] = body
            waiter.wake()

    def stopping(self) -> None:
        """The server stops: every parked wait answers now (docs/hazards.md #6)."""
        for waiter in self._waiters.values():
            waiter.wake()

    # -- one request --------------------------------------------------------------------

    async def answer(self, body: Any) -> tuple[int, bytes]:
        """The status and JSON body answering one decoded request ``body``."""
        try:
            return 200, await self._wait(body)
        except WaitRequestError as exc:
            return 422, _encode({"detail": str(exc)})

    async def _wait(self, body: Any) -> bytes:
        if not isinstance(body, dict):
            raise WaitRequestError("the body must be a JSON object")
        key = body.get("waiter")
        if not valid_waiter(key):
            raise WaitRequestError("waiter must be 16 to 128 characters of A-Z a-z 0-9 _ -")
        adds, acks = _adds(body.get("add")), _ids(body.get("ack"), "ack")
        hold = self.service.hold
        timeout = min(max(_number(body.get("timeout_sec"), "timeout_sec", hold), 0.0), hold)
        limit = _number(body.get("max_results"), "max_results", MAX_RESULTS)
        limit = int(min(max(limit, 1), MAX_RESULTS))

        now = trio.current_time()
        waiter = self._waiter(key, now)
        for rollout_id in acks:
            waiter.ready.pop(rollout_id, None)
            if rollout_id in waiter.watched:
                self._unwatch(waiter, rollout_id)
        rejected = self._add(waiter, adds)
        if now - waiter.renewed >= _RENEW_EVERY:
            waiter.renewed = now
            for rollout_id in list(waiter.watched):
                self.service.renew(rollout_id)  # an expiry lands in ``ready`` at once
        if not waiter.ready and not rejected and timeout > 0 and not self.service.stopping:
            waiter.parked += 1
            try:
                with trio.move_on_after(timeout):
                    await waiter.wakeup.wait()
            finally:
                waiter.parked -= 1
                waiter.seen = trio.current_time()
        ready = waiter.ready
        bodies = list(ready.values())[:limit] if len(ready) > limit else list(ready.values())
        return b"".join(
            (
                b'{"results":[',
                b",".join(bodies),
                b'],"rejected":',
                _encode(rejected),
                b',"more":',
                b"true" if len(ready) > limit else b"false",
                b',"watching":',
                str(len(waiter.watched)).encode(),
                b"}",
            )
        )

    def watch_admitted(self, key: str, rollout_id: str) -> None:
        """Watch a rollout just admitted with the waiter ``key`` (:func:`valid_waiter`) in its
        :data:`WAITER_HEADER`: the admission proved the token, no ``add`` is needed."""
        waiter = self._waiter(key, trio.current_time())
        if rollout_id not in waiter.watched:
            waiter.watched.add(rollout_id)
            self._watchers.setdefault(rollout_id, []).append(waiter)

    def _waiter(self, key: str, now: float) -> _Waiter:
        self._collect(now)
        digest = hashlib.sha256(key.encode("ascii")).digest()
        waiter = self._waiters.get(digest)
        if waiter is None:
            waiter = self._waiters[digest] = _Waiter(now)
        waiter.seen = now
        return waiter

    def _add(self, waiter: _Waiter, adds: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        rejected: dict[str, dict[str, Any]] = {}
        for rollout_id, token in adds.items():
            try:
                final = self.service.attach(rollout_id, token)
            except UnknownRollout:
                rejected[rollout_id] = {"status": 404, "detail": "unknown rollout_id"}
                continue
            except LeaseMismatch:
                rejected[rollout_id] = {"status": 403, "detail": "invalid polling lease"}
                continue
            if final is not None:
                waiter.ready[rollout_id] = final
            elif rollout_id not in waiter.watched:
                waiter.watched.add(rollout_id)
                self._watchers.setdefault(rollout_id, []).append(waiter)
        return rejected

    def _unwatch(self, waiter: _Waiter, rollout_id: str) -> None:
        waiter.watched.discard(rollout_id)
        watchers = self._watchers.get(rollout_id)
        if watchers is not None and waiter in watchers:
            watchers.remove(waiter)
            if not watchers:
                del self._watchers[rollout_id]

    def _collect(self, now: float) -> None:
        """Forget the waiters nobody waited on for the lease time (at most once per quarter
        of it): their rollouts' leases have run out by then anyway."""
        lease = self.service.lease
        if now - self._collected < lease / 4:
            return
        self._collected = now
        for digest, waiter in list(self._waiters.items()):
            if not waiter.parked and now - waiter.seen >= lease:
                for rollout_id in list(waiter.watched):
                    self._unwatch(waiter, rollout_id)
                del self._waiters[digest]
