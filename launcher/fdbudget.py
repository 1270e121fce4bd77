"""File descriptors for a run's rollouts in flight (issue 29, item 1).

Each rollout in flight holds sockets on every hop of ours: at the rollout server the
rollout's model call out; at the bridge that call in and the provider call out; and, unless
the rollout server offers the batched result wait (launcher.resultwait), the supervisor's
long-poll out and the rollout server's long-poll in. With one HTTP/1.1 connection per
outstanding request that is, per rollout in flight, 1 descriptor in the supervisor, 2 in the
rollout server and 2 in the bridge with per-id long-polls, and 0, 1 and 2 with the batched
wait; on top of what any process holds anyway (its imports, logs, pipes, the journal, the
pooled admission connections). :func:`per_rollout` says it per process and
:func:`fit_in_flight` budgets for the process that needs the most, so a change to one hop
only changes its count there: with HTTP/2 to the provider (``[bridge] upstream_http2``,
:mod:`bridge.upstreams.h2pool`) the bridge's calls out share connections, about one per
hundred calls (within the reserve up to ~10,000 in flight), so the bridge counts 1 per rollout
(:data:`BRIDGE_PER_ROLLOUT_H2`); :func:`choose_http2` turns it on for ``"auto"``.

Before dispatch the supervisor raises its soft ``RLIMIT_NOFILE`` as far as the hard limit
allows (:func:`raise_descriptor_limit`, before it spawns the bridge and the rollout server,
which inherit it) and caps the rollouts in flight to what that limit holds
(:func:`fit_in_flight`), saying so, instead of letting rows fail. A descriptor running out
anyway (a rollout that opens files of its own) is recognised by :func:`exhaustion_in_text`
and :func:`exhaustion_in_exception`, and halts dispatch with that cause rather than
journaling failed rows.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

__all__ = [
    "BRIDGE_PER_ROLLOUT",
    "BRIDGE_PER_ROLLOUT_H2",
    "PER_ROLLOUT",
    "RESERVE",
    "DescriptorLimit",
    "choose_http2",
    "exhaustion_in_exception",
    "exhaustion_in_text",
    "exhaustion_reason",
    "fit_in_flight",
    "per_rollout",
    "raise_descriptor_limit",
]

#: Descriptors per rollout in flight in the process that needs the most with per-id
#: long-polls: the rollout server and the bridge process (one in, one out each).
PER_ROLLOUT = 2
#: The bridge's per rollout in flight: the rollout's model call in, the provider call out.
BRIDGE_PER_ROLLOUT = 2
#: The same over HTTP/2 to the provider: the call in; the calls out share a connection per
#: hundred or so (bridge.upstreams.h2pool), counted in the reserve.
BRIDGE_PER_ROLLOUT_H2 = 1
#: Descriptors kept free in every process for what does not grow with the rollouts in flight:
#: stdio, logs, pipes to children, the journal and the files of the results being written,
#: the pooled admission connections (64 at most, ``launcher.dispatch``), the event loop's own.
#: A quarter of the limit when that is less (a process needs a few dozen of its own), so a
#: low limit still runs as many rollouts as it can hold.
RESERVE = 256
#: Soft limits tried, largest first, where the hard limit is unlimited: the kernel's own
#: ceiling (Linux's ``fs.nr_open``, macOS's ``kern.maxfilesperproc``) is not readable
#: portably, and a value above it is refused.
_UNLIMITED_TRIES = (1 << 20, 1 << 16, 10240)

_EXHAUSTED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
#: How the two errors read once they crossed a process boundary as text (``str(OSError)``).
_EXHAUSTED_TEXTS = ("Too many open files", "[Errno 24]", "[Errno 23]")


@dataclass(frozen=True)
class DescriptorLimit:
    """This process's ``RLIMIT_NOFILE`` (None: unlimited, or unknown on this platform)."""

    soft: int | None
    hard: int | None
    raised_from: int | None = None
    """The soft limit before :func:`raise_descriptor_limit` raised it, when it did."""


def _finite(value: int, infinity: int) -> int | None:
    return None if value == infinity or value < 0 else value


def raise_descriptor_limit() -> DescriptorLimit:
    """Raise the soft open-file limit to the hard limit (processes spawned afterwards inherit
    it) and return the limits in force. Where the hard limit is unlimited the soft one goes
    as high as the kernel takes (an unlimited soft limit is refused by some); a refusal
    leaves it as it was."""
    try:
        import resource
    except ImportError:  # not on posix: nothing to raise, nothing to budget
        return DescriptorLimit(None, None)
    infinity = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == infinity:
        return DescriptorLimit(None, _finite(hard, infinity))
    tries = _UNLIMITED_TRIES if hard == infinity else (hard,)
    for value in tries:
        if value <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (value, hard))
        except (OSError, ValueError):
            continue
        return DescriptorLimit(value, _finite(hard, infinity), raised_from=soft)
    return DescriptorLimit(soft, _finite(hard, infinity))


def per_rollout(
    *,
    batched_wait: bool = False,
    bridge_in_process: bool = False,
    bridge: int = BRIDGE_PER_ROLLOUT,
) -> dict[str, int]:
    """Descriptors per rollout in flight in each of the run's processes (by name, as the
    notice says it). ``batched_wait``: the rollout server offers the batched result wait, so
    neither the supervisor nor the server holds a long-poll per rollout. ``bridge``: the
    bridge's count (in and out); with ``bridge_in_process`` it is held by the supervisor."""
    poll = 0 if batched_wait else 1
    needs = {"the supervisor": poll, "the rollout server": poll + 1}
    if bridge_in_process:
        needs["the supervisor"] += bridge
    else:
        needs["the bridge"] = bridge
    return needs


def fit_in_flight(
    in_flight: int,
    limit: DescriptorLimit,
    *,
    bridge_in_process: bool = False,
    needs: dict[str, int] | None = None,
) -> tuple[int, str | None]:
    """The rollouts in flight that ``limit`` holds in every process (at most ``in_flight``),
    and the one-line notice to show when that is fewer than asked. ``needs``: descriptors per
    rollout per process (:func:`per_rollout`; by default the per-id long-polls')."""
    if limit.soft is None:
        return in_flight, None
    if needs is None:
        needs = per_rollout(bridge_in_process=bridge_in_process)
    per = max(max(needs.values(), default=1), 1)
    where = " and ".join(name for name, count in needs.items() if count == per) or "each process"
    reserve = min(RESERVE, limit.soft // 4)
    fits = max(1, (limit.soft - reserve) // per)
    if in_flight <= fits:
        return in_flight, None
    needed = in_flight * per + reserve
    hard = "unlimited" if limit.hard is None else str(limit.hard)
    return fits, (
        f"{in_flight} rollouts in flight need about {needed} open files in {where} "
        f"({per} per rollout + {reserve}), above the open-file limit of {limit.soft} "
        f"(hard limit {hard}); running {fits} rollouts at a time "
        "(raise the hard limit, `ulimit -Hn`, to run more)"
    )


def batched_wait_needed(
    in_flight: int, limit: DescriptorLimit, *, bridge_in_process: bool, bridge: int
) -> bool:
    """Whether ``in_flight`` rollouts do not fit ``limit`` with one long-poll per rollout while
    the rollout server's batched wait fits more of them (``bridge``: the bridge's descriptors
    per rollout)."""
    per_id, _ = fit_in_flight(
        in_flight,
        limit,
        needs=per_rollout(bridge_in_process=bridge_in_process, bridge=bridge),
    )
    batched, _ = fit_in_flight(
        in_flight,
        limit,
        needs=per_rollout(batched_wait=True, bridge_in_process=bridge_in_process, bridge=bridge),
    )
    return per_id < in_flight and batched > per_id


def choose_http2(
    mode: str, asked: int | None, limit: DescriptorLimit, *, applies: bool = True
) -> tuple[bool, str | None]:
    """Whether the bridge calls the provider over HTTP/2 for ``[bridge] upstream_http2 =
    mode`` (``off``, ``on``, ``auto``) when ``asked`` rollouts in flight were asked for (None:
    not said), and the one-line notice when ``auto`` turned it on: ``auto`` turns it on when
    the bridge, at one HTTP/1.1 connection per provider call, would not hold ``asked``, and
    only when it ``applies`` (every provider call of the model would go over HTTP/2)."""
    if mode != "auto":
        return mode == "on", None
    if not applies or asked is None or limit.soft is None:
        return False, None
    reserve = min(RESERVE, limit.soft // 4)
    needed = asked * BRIDGE_PER_ROLLOUT + reserve
    if needed <= limit.soft:
        return False, None
    return True, (
        f"{asked} rollouts in flight need about {needed} open files in the bridge with one "
        f"HTTP/1.1 connection per provider call ({BRIDGE_PER_ROLLOUT} per rollout + {reserve}), "
        f"above the open-file limit of {limit.soft}; calling the provider over HTTP/2 "
        '([bridge] upstream_http2 = "auto"), one open file per rollout in the bridge'
    )


def exhaustion_in_text(text: str | None) -> bool:
    """Whether an error message says a process ran out of file descriptors."""
    if not text:
        return False
    return any(marker in text for marker in _EXHAUSTED_TEXTS)


def exhaustion_in_exception(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause, context, or a member of an exception group) is a process
    running out of file descriptors (EMFILE, ENFILE)."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _EXHAUSTED_ERRNOS:
            return True
        if exhaustion_in_text(str(current)):
            return True
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def exhaustion_reason(where: str, message: str) -> str:
    """The halt reason for descriptors running out in ``where``."""
    text = " ".join(message.split())
    if len(text) > 300:
        text = text[:299] + "…"
    return (
        f"{where} ran out of file descriptors ({text}); the rows in flight stay pending: "
        "resume with a lower --max-in-flight, or raise the open-file hard limit (`ulimit -Hn`)"
    )
