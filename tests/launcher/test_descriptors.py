"""File descriptors of a run (issue 29, item 1): the soft open-file limit is raised to the
hard one before any child starts, the rollouts in flight are capped to what the limit holds
(with a notice naming the numbers), and running out of descriptors anyway halts dispatch with
that cause instead of journaling failed rows."""

from __future__ import annotations

import errno
import subprocess
import sys
from typing import Any

import pytest
import trio
import trio.testing

from launcher.dispatch import RUN_WIDE_FAILURES, RolloutRefused
from launcher.fdbudget import (
    BRIDGE_PER_ROLLOUT_H2,
    PER_ROLLOUT,
    RESERVE,
    DescriptorLimit,
    choose_http2,
    exhaustion_in_exception,
    exhaustion_in_text,
    fit_in_flight,
    per_rollout,
    raise_descriptor_limit,
)
from rollout_server.protocol import RolloutInitRequest
from tests.launcher.test_dispatch import (
    ScriptedTransport,
    _dispatcher,
    _interrupts,
    _item,
    _success,
)
from tests.launcher.test_run_wide_faults import _failure, _row

resource = pytest.importorskip("resource", reason="needs posix resource limits")

_PROBE = """
import resource
from launcher.fdbudget import raise_descriptor_limit
limit = raise_descriptor_limit()
print(limit.soft, limit.hard, limit.raised_from, *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def _limited(soft: int, hard: int) -> Any:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return preexec


def test_the_soft_limit_is_raised_to_the_hard_limit() -> None:
    _, hard_now = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = 4096 if hard_now == resource.RLIM_INFINITY else min(hard_now, 4096)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        preexec_fn=_limited(256, hard),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert out == [str(hard), str(hard), "256", str(hard), str(hard)]


def test_in_flight_is_capped_to_what_the_limit_holds() -> None:
    assert fit_in_flight(100, DescriptorLimit(None, None)) == (100, None)
    assert fit_in_flight(100, DescriptorLimit(20_000, 20_000)) == (100, None)
    fits, notice = fit_in_flight(10_000, DescriptorLimit(20_000, 20_000))
    assert fits == (20_000 - RESERVE) // PER_ROLLOUT == 9872
    assert notice is not None and "\n" not in notice
    assert (
        "10000 rollouts in flight need about 20256 open files in the rollout server and the "
        "bridge (2 per rollout + 256)" in notice
    )
    assert "limit of 20000 (hard limit 20000); running 9872 rollouts at a time" in notice
    # The bridge inside the supervisor adds its two sockets to the supervisor's one.
    assert fit_in_flight(10_000, DescriptorLimit(20_000, 20_000), bridge_in_process=True)[0] == (
        (20_000 - RESERVE) // 3
    )


def test_the_batched_wait_takes_the_long_polls_out_of_the_budget() -> None:
    assert per_rollout() == {"the supervisor": 1, "the rollout server": 2, "the bridge": 2}
    assert per_rollout(batched_wait=True) == {
        "the supervisor": 0,
        "the rollout server": 1,
        "the bridge": 2,
    }
    assert per_rollout(batched_wait=True, bridge_in_process=True) == {
        "the supervisor": 2,
        "the rollout server": 1,
    }
    limit = DescriptorLimit(20_000, 20_000)
    # The bridge still needs two per rollout, so it sets the cap, and the notice names it.
    fits, notice = fit_in_flight(10_000, limit, needs=per_rollout(batched_wait=True))
    assert fits == 9872 and notice is not None and "open files in the bridge (2 per" in notice
    # Once the bridge needs one (HTTP/2 to the provider, say), 10,000 fit under 20,000.
    needs = per_rollout(batched_wait=True, bridge=1)
    assert fit_in_flight(10_000, limit, needs=needs) == (10_000, None)
    assert fit_in_flight(10_000, limit, needs=per_rollout(bridge=1))[0] == 9872
    # A low limit keeps a quarter for the process itself, and still runs one at the least.
    assert fit_in_flight(8, DescriptorLimit(100, 100)) == (8, None)
    fits, notice = fit_in_flight(80, DescriptorLimit(100, 100))
    assert fits == 37 and notice is not None and "(2 per rollout + 25)" in notice
    assert fit_in_flight(8, DescriptorLimit(1, 1))[0] == 1


def test_http2_to_the_provider_takes_the_bridge_to_one_per_rollout() -> None:
    limit = DescriptorLimit(20_000, 20_000)
    needs = per_rollout(batched_wait=True, bridge=BRIDGE_PER_ROLLOUT_H2)
    assert needs["the bridge"] == 1
    assert fit_in_flight(10_000, limit, needs=needs) == (10_000, None)
    # off and on are what they say, whatever the in-flight asked for.
    assert choose_http2("off", 10_000, limit) == (False, None)
    assert choose_http2("on", 1, limit) == (True, None)
    # auto: on only when two per call in the bridge would not fit, saying so in one line.
    assert choose_http2("auto", 9_872, limit) == (False, None)
    assert choose_http2("auto", None, limit) == (False, None)
    assert choose_http2("auto", 10_000, DescriptorLimit(None, None)) == (False, None)
    # ...and only where every provider call would go over HTTP/2 (not LiteLLM's, say).
    assert choose_http2("auto", 10_000, limit, applies=False) == (False, None)
    on, notice = choose_http2("auto", 10_000, limit)
    assert on and notice is not None and "\n" not in notice
    assert notice.startswith(
        "10000 rollouts in flight need about 20256 open files in the bridge with one "
        "HTTP/1.1 connection per provider call (2 per rollout + 256), above the open-file "
        "limit of 20000; calling the provider over HTTP/2"
    )


def test_an_unlimited_hard_limit_raises_the_soft_one_as_far_as_the_kernel_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    infinity = resource.RLIM_INFINITY
    state = {"soft": 256}

    def setrlimit(which: int, limits: tuple[int, int]) -> None:
        if limits[0] > 65536:  # this kernel's ceiling
            raise ValueError("not allowed to raise maximum limit")
        state["soft"] = limits[0]

    monkeypatch.setattr(resource, "getrlimit", lambda which: (state["soft"], infinity))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert raise_descriptor_limit() == DescriptorLimit(65536, None, raised_from=256)
    assert raise_descriptor_limit() == DescriptorLimit(65536, None)  # already there


def test_exhaustion_is_recognised_in_text_and_exceptions() -> None:
    assert exhaustion_in_text("agent: OSError: [Errno 24] Too many open files: '/dev/null'")
    assert exhaustion_in_text("[Errno 23] Too many open files in system")
    assert not exhaustion_in_text("boom") and not exhaustion_in_text(None)
    assert exhaustion_in_exception(OSError(errno.EMFILE, "Too many open files"))
    wrapped = RuntimeError("connect failed")
    wrapped.__cause__ = OSError(errno.EMFILE, "x")
    assert exhaustion_in_exception(ExceptionGroup("g", [ValueError("v"), wrapped]))
    assert not exhaustion_in_exception(OSError(errno.ECONNREFUSED, "refused"))


async def test_a_rollout_out_of_descriptors_halts_without_journaling_rows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        if _row(request) < 2:
            return _success(request)
        return _failure(request, "OSError: [Errno 24] Too many open files")

    transport = ScriptedTransport(outcome)
    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(40)], transport, _interrupts(), concurrency=2
    )
    report = await dispatcher.run()
    # The two rows that succeeded are journaled; the one that met EMFILE, and everything in
    # flight with it, is not (it stays pending), and no failed row exists at all.
    assert [r.status for r in records] == ["success", "success"]
    assert len(halts) == 1 and report.halted == halts[0]
    assert halts[0].startswith(
        "the rollout server or the bridge ran out of file descriptors "
        "(OSError: [Errno 24] Too many open files)"
    )
    assert "--max-in-flight" in halts[0] and "ulimit -Hn" in halts[0]
    assert len(transport.requests) < RUN_WIDE_FAILURES + 2


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.EMFILE, "Too many open files"),
        RolloutRefused(None, "[Errno 24] Too many open files", kind="OSError"),
    ],
)
async def test_the_supervisor_out_of_descriptors_halts_without_rows(
    autojump_clock: trio.testing.MockClock, error: Exception
) -> None:
    def outcome(request: RolloutInitRequest) -> Any:
        return error if _row(request) == 3 else _success(request)

    dispatcher, records, halts = _dispatcher(
        [_item(r) for r in range(10)], ScriptedTransport(outcome), _interrupts(), concurrency=1
    )
    report = await dispatcher.run()
    assert [r.row_index for r in records] == [0, 1, 2]
    assert report.halted is not None and halts == [report.halted]
    assert report.halted.startswith("the supervisor ran out of file descriptors")
