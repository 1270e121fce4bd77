"""The registry in virtual time (autojump_clock): leases, retention, cancellation, shutdown.

No sockets and no threads here, so trio's clock can jump: a 900 s retention takes no real time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.lowlevel
import trio.testing

from rollout_server import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    LocalBackend,
    RolloutSample,
    RolloutService,
)
from rollout_server.protocol import (
    CancelRolloutsRequest,
    RolloutInitRequest,
    RolloutStatus,
)
from rollout_server.service import AdmissionRefused, LeaseMismatch, UnknownRollout

from .helpers import ScriptedGrader, ScriptedWorkflow


class SleepyBackend(ExecutionBackend):
    """Sleeps ``metadata["sleep"]`` seconds (default: forever), then succeeds with reward 1."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.cleanup_sec = 0.0
        self.claim_cancel = False

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        try:
            await trio.sleep((request.metadata or {}).get("sleep", float("inf")))
        except trio.Cancelled:
            self.cancelled.append(request.id)
            if self.cleanup_sec:
                with trio.CancelScope(shield=True):
                    await trio.sleep(self.cleanup_sec)
            raise
        sample = RolloutSample([{"role": "assistant", "content": "x"}], trajectory_messages=None)
        sample.reward = 1.0
        return ExecutionOutcome(ExecutionResult(RolloutStatus.SUCCESS, sample=sample))

    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, Any]:
        return {i: "cancelled_running" for i in ids or []} if self.claim_cancel else {}


def req(rollout_id: str, **metadata: Any) -> RolloutInitRequest:
    return RolloutInitRequest(
        initial_messages=[],
        rollout_id=rollout_id,
        chat_completions_url="http://x",
        metadata=metadata or None,
    )


async def started(nursery: trio.Nursery, backend: ExecutionBackend, **kw: Any) -> RolloutService:
    kw.setdefault("artifact_root", "/nonexistent-rollbridge-test")
    service = RolloutService(backend, **kw)
    await nursery.start(service.run)
    return service


def decoded(body: bytes) -> dict[str, Any]:
    return msgspec.json.decode(body)


async def final(service: RolloutService, rollout_id: str, token: str) -> dict[str, Any]:
    """Poll like a client until the result is terminal."""
    while True:
        body = decoded(await service.poll(rollout_id, token))
        if body["status"] in ("success", "failure", "cancelled"):
            return body


async def test_lease_expires_without_polls_and_cancels(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    backend = SleepyBackend()
    service = await started(nursery, backend, polling_lease_timeout_sec=120.0)
    token = service.admit(req("a"))["polling_lease_token"]
    await trio.sleep(119.0)
    assert service.status_of("a") == RolloutStatus.RUNNING
    await trio.sleep(1.5)
    result = decoded(await service.poll("a", token))
    assert result == {
        "rollout_id": "a",
        "status": "failure",
        "sample": None,
        "err_message": "polling lease expired",
        "err_category": "lease_expired",
    }
    assert backend.cancelled == ["a"]
    # After the lease failure, a cancel reports not_found and the id stays reserved.
    assert service.cancel(CancelRolloutsRequest(ids=["a"])) == {"a": "not_found"}
    with pytest.raises(AdmissionRefused) as refused:
        service.admit(req("a"))
    assert refused.value.status == 409


async def test_lease_renewed_on_poll_arrival(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    backend = SleepyBackend()
    service = await started(
        nursery, backend, result_wait_timeout_sec=30.0, polling_lease_timeout_sec=40.0
    )
    token = service.admit(req("a", sleep=330.0))["polling_lease_token"]
    await trio.lowlevel.checkpoint()
    # Each poll arrives 35 s after the previous one arrived (30 s hold + 5 s pause): only
    # renewal on arrival keeps the 40 s lease alive.
    for _ in range(9):
        body = decoded(await service.poll("a", token))
        assert body["status"] == "running"
        await trio.sleep(5.0)
    assert (await final(service, "a", token))["status"] == "success"
    assert backend.cancelled == []


async def test_poll_arriving_after_deadline_expires(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(
        nursery, SleepyBackend(), result_wait_timeout_sec=1.0, polling_lease_timeout_sec=2.0
    )
    token = service.admit(req("a"))["polling_lease_token"]
    await trio.sleep(5.0)
    assert decoded(await service.poll("a", token))["err_category"] == "lease_expired"


async def test_completion_after_lease_deadline_is_replaced(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # The execution finishes exactly at the lease deadline: the lease failure wins.
    service = await started(
        nursery, SleepyBackend(), result_wait_timeout_sec=1.0, polling_lease_timeout_sec=10.0
    )
    token = service.admit(req("a", sleep=10.0))["polling_lease_token"]
    await trio.sleep(11.0)
    assert decoded(await service.poll("a", token))["err_category"] == "lease_expired"


async def test_queued_time_comes_out_of_the_agent_budget(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """LocalBackend: time spent waiting for a slot is charged to ``agent_timeout_sec``."""
    backend = LocalBackend(ScriptedWorkflow, ScriptedGrader, max_concurrent=1)
    service = await started(nursery, backend, artifact_root=tmp_path)
    first = service.admit(
        RolloutInitRequest(
            initial_messages=[],
            rollout_id="q1",
            chat_completions_url="http://x",
            label="L",
            metadata={"sleep": 1.0},
        )
    )
    await trio.testing.wait_all_tasks_blocked()  # q1 holds the one slot
    second = service.admit(
        RolloutInitRequest(
            initial_messages=[],
            rollout_id="q2",
            chat_completions_url="http://x",
            label="L",
            metadata={"sleep": 0.01},
            agent_timeout_sec=0.5,
        )
    )
    await trio.testing.wait_all_tasks_blocked()
    assert backend.health()["concurrency"] == {"max_concurrent": 1, "queued": 1, "running": 1}
    assert (await final(service, "q1", first["polling_lease_token"]))["status"] == "success"
    # q2 waited the whole 1.0 s of q1 for the slot: its 0.5 s budget was gone before it ran.
    assert await final(service, "q2", second["polling_lease_token"]) == {
        "rollout_id": "q2",
        "status": "failure",
        "sample": None,
        "err_message": "workflow exceeded its 0.5s deadline (1.0s of it spent queued)",
        "err_category": "timeout",
    }


async def test_retention_then_404_and_reuse(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend(), result_retention_sec=900.0)
    token = service.admit(req("a", sleep=1.0))["polling_lease_token"]
    result = await final(service, "a", token)
    assert result["status"] == "success"
    assert result["sample"]["reward"] == 1.0
    await trio.sleep(899.0)
    # Still retained: same body, 409 on re-admission, not_found on cancel, 403 for bad token.
    assert decoded(await service.poll("a", token)) == result
    with pytest.raises(AdmissionRefused):
        service.admit(req("a"))
    assert service.cancel(CancelRolloutsRequest(all=True)) == {"a": "not_found"}
    with pytest.raises(LeaseMismatch):
        await service.poll("a", "wrong")
    await trio.sleep(2.0)
    with pytest.raises(UnknownRollout):
        await service.poll("a", token)
    again = service.admit(req("a", sleep=1.0))
    assert again["polling_lease_token"] != token
    assert (await final(service, "a", again["polling_lease_token"]))["status"] == "success"


async def test_retention_waits_for_execution_cleanup(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    backend = SleepyBackend()
    backend.cleanup_sec = 50.0
    service = await started(
        nursery,
        backend,
        result_retention_sec=10.0,
        result_wait_timeout_sec=5.0,
        polling_lease_timeout_sec=20.0,
    )
    token = service.admit(req("a"))["polling_lease_token"]
    await trio.sleep(21.0)  # lease expired at 20 s: final at once, cleanup runs until 70 s
    assert decoded(await service.poll("a", token))["err_category"] == "lease_expired"
    await trio.sleep(20.0)  # retention (10 s) is over, but the task is still cleaning up
    assert decoded(await service.poll("a", token))["err_category"] == "lease_expired"
    assert service.active == 1
    await trio.sleep(30.0)
    assert service.active == 0
    with pytest.raises(UnknownRollout):
        await service.poll("a", token)


async def test_zero_retention_removes_when_done(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend(), result_retention_sec=0.0)
    token = service.admit(req("a", sleep=1.0))["polling_lease_token"]
    assert (await final(service, "a", token))["status"] == "success"
    await trio.sleep(0.1)
    with pytest.raises(UnknownRollout):
        await service.poll("a", token)


async def test_long_poll_holds_then_returns_current_status(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend(), result_wait_timeout_sec=30.0)
    token = service.admit(req("a", sleep=100.0))["polling_lease_token"]
    await trio.sleep(1.0)
    before = trio.current_time()
    assert decoded(await service.poll("a", token))["status"] == "running"
    assert trio.current_time() - before == pytest.approx(30.0)


async def test_backend_claimed_cancel_leaves_the_task_alone(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    backend = SleepyBackend()
    backend.claim_cancel = True
    service = await started(nursery, backend)
    service.admit(req("a", sleep=5.0))
    await trio.sleep(1.0)
    assert service.cancel(CancelRolloutsRequest(prefix="")) == {"a": "cancelled_running"}
    # The stored disposition is returned again while the result is pending.
    assert service.cancel(CancelRolloutsRequest(ids=["a"])) == {"a": "cancelled_running"}
    assert backend.cancelled == []


async def test_cancel_selection(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = await started(nursery, SleepyBackend())
    for name in ("job-1", "job-2", "other"):
        service.admit(req(name))
    await trio.sleep(1.0)
    assert service.cancel(CancelRolloutsRequest(ids=[])) == {}
    assert service.cancel(CancelRolloutsRequest(prefix="job-")) == {
        "job-1": "cancelled_running",
        "job-2": "cancelled_running",
    }
    assert service.cancel(CancelRolloutsRequest(ids=["other", "other", "nope"])) == {
        "other": "cancelled_running",
        "nope": "not_found",
    }


async def test_shutdown_drains_then_cancels_then_forces(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, capsys: Any
) -> None:
    backend = SleepyBackend()
    backend.claim_cancel = True  # the backend "owns" cancellation, but never finishes
    service = await started(nursery, backend)
    service.admit(req("quick", sleep=5.0))
    service.admit(req("stuck"))
    start = trio.current_time()
    async with trio.open_nursery() as inner:
        inner.start_soon(service.shutdown)
        await trio.sleep(1.0)
        assert not service.accepting
        with pytest.raises(AdmissionRefused) as refused:
            service.admit(req("late"))
        assert refused.value.status == 503
        assert service.health()["lifecycle"] == {"accepting_rollouts": False, "active_rollouts": 2}
    # 10 s drain, 120 s waiting on the backend's cancel, then a forced cancel.
    assert trio.current_time() - start == pytest.approx(130.0)
    assert backend.cancelled == ["stuck"]
    assert service.active == 0
    assert "did not confirm cleanup" not in capsys.readouterr().out


async def test_shutdown_reports_unconfirmed_cleanup(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, capsys: Any
) -> None:
    backend = SleepyBackend()
    backend.cleanup_sec = 1000.0
    service = await started(nursery, backend)
    service.admit(req("stuck"))
    await trio.sleep(0.5)
    await service.shutdown()
    assert "1 rollout(s) did not confirm cleanup" in capsys.readouterr().out


async def test_status_transitions_wake_pollers(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[str] = []

    class Grading(ExecutionBackend):
        async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
            from rollout_server import get_rollout_context

            await trio.sleep(3.0)
            ctx = get_rollout_context()
            assert ctx is not None
            await ctx.set_status(RolloutStatus.GRADING)
            await trio.sleep(3.0)
            return ExecutionOutcome(ExecutionResult(RolloutStatus.FAILURE, err_message="meh"))

    service = await started(nursery, Grading(), result_wait_timeout_sec=30.0)
    start = trio.current_time()
    token = service.admit(req("a"))["polling_lease_token"]
    await trio.sleep(0.5)
    while True:
        body = decoded(await service.poll("a", token))
        seen.append(f"{body['status']}@{trio.current_time() - start:.1f}")
        if body["status"] in ("success", "failure", "cancelled"):
            break
    # Each poll returned at the transition, not after the 30 s hold.
    assert seen == ["grading@3.0", "failure@6.0"]


class GradingForever(ExecutionBackend):
    """Reaches ``grading`` after 1 s, then never finishes."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        from rollout_server import get_rollout_context

        ctx = get_rollout_context()
        assert ctx is not None
        try:
            await trio.sleep(1.0)
            await ctx.set_status(RolloutStatus.GRADING)
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.append(request.id)
            raise
        raise AssertionError("unreachable")


async def test_cancel_in_every_state(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    backend = GradingForever()
    service = await started(nursery, backend, result_retention_sec=100.0)
    # queued: cancelled before its execution task ever ran
    queued_token = service.admit(req("queued"))["polling_lease_token"]
    assert service.status_of("queued") == RolloutStatus.QUEUED
    assert service.cancel(CancelRolloutsRequest(ids=["queued"])) == {"queued": "cancelled_queued"}
    assert (await final(service, "queued", queued_token))["status"] == "cancelled"
    assert backend.cancelled == []  # it never reached the backend
    # running and grading
    tokens = {name: service.admit(req(name))["polling_lease_token"] for name in ("run", "grade")}
    await trio.sleep(0.5)
    assert service.cancel(CancelRolloutsRequest(ids=["run"])) == {"run": "cancelled_running"}
    await trio.sleep(1.0)
    assert service.status_of("grade") == RolloutStatus.GRADING
    assert service.cancel(CancelRolloutsRequest(ids=["grade"])) == {"grade": "cancelled_running"}
    for name, token in tokens.items():
        assert (await final(service, name, token)) == {
            "rollout_id": name,
            "status": "cancelled",
            "sample": None,
            "err_message": "cancelled",
            "err_category": None,
        }
    assert sorted(backend.cancelled) == ["grade", "run"]
    # terminal and retained: not_found; removed: not_found too, and the id is free again
    assert service.cancel(CancelRolloutsRequest(all=True)) == {
        "queued": "not_found",
        "run": "not_found",
        "grade": "not_found",
    }
    await trio.sleep(200.0)
    assert service.cancel(CancelRolloutsRequest(ids=["run"])) == {"run": "not_found"}
    assert service.cancel(CancelRolloutsRequest(all=True)) == {}
    service.admit(req("run"))


async def test_backend_failure_and_crash_categories(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    class Broken(ExecutionBackend):
        async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
            if request.id == "raises":
                raise KeyError("")
            return ExecutionOutcome(ExecutionResult("nonsense"))  # type: ignore[arg-type]

    service = await started(nursery, Broken())
    token = service.admit(req("raises"))["polling_lease_token"]
    result = await final(service, "raises", token)
    assert (result["status"], result["err_message"], result["err_category"]) == (
        "failure",
        "''",
        "agent_error",
    )
    token = service.admit(req("crash"))["polling_lease_token"]
    result = await final(service, "crash", token)
    assert (result["status"], result["err_message"], result["err_category"]) == (
        "failure",
        "rollout task crashed",
        "internal_error",
    )


def test_constructor_constraints() -> None:
    backend = SleepyBackend()
    for kwargs in (
        {"result_wait_timeout_sec": 0},
        {"result_wait_timeout_sec": float("nan")},
        {"result_wait_timeout_sec": 30.0, "polling_lease_timeout_sec": 30.0},
        {"result_retention_sec": -1},
        {"polling_lease_timeout_sec": float("inf")},
    ):
        with pytest.raises(ValueError):
            RolloutService(backend, **kwargs)
    RolloutService(backend, result_retention_sec=0)


class ClientRecordingBackend(SleepyBackend):
    """Records the HTTP client each rollout's context carries."""

    def __init__(self) -> None:
        super().__init__()
        self.clients: list[Any] = []

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        from rollout_server import get_rollout_context

        context = get_rollout_context()
        assert context is not None
        self.clients.append(context.http_client)
        return await super().execute(request)


async def test_the_http_client_factory_runs_once_at_the_first_rollout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    made: list[object] = []

    def factory() -> Any:
        made.append(object())
        return made[-1]

    backend = ClientRecordingBackend()
    service = await started(nursery, backend, http_client_factory=factory)
    await trio.sleep(1.0)
    assert made == [] and service.http_client is None  # nothing made before a rollout
    tokens = [service.admit(req(name, sleep=1.0))["polling_lease_token"] for name in "ab"]
    for name, token in zip("ab", tokens, strict=True):
        assert (await final(service, name, token))["status"] == "success"
    assert len(made) == 1
    assert backend.clients == [made[0], made[0]]
    assert service.http_client is made[0]
