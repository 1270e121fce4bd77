"""LocalBackend: runs the workflow and grader in-process, with a concurrency limit."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import trio

from .backend import (
    FAILURE_KEY,
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    describe_exception,
    load_object,
)
from .backend import categorize_exception as _categorize
from .protocol import RolloutErrorCategory, RolloutStatus
from .sdk import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    RolloutSample,
    get_rollout_context,
)
from .trajectory import make_private_dirs

__all__ = ["HEALTH_CHECK_MARKER", "LocalBackend"]

HEALTH_CHECK_MARKER = ".osmosis-health-check"
_MARKER_CONTENT = b"osmosis-health-check"
_DIR_ATTEMPT_DELAYS = (0.5, 1.0)
_UNSET: Any = object()
_NO_GRADER = "no grader ran: the rollout has no grader, or the row has neither a label nor metadata"


def _resolve(target: Any) -> Any:
    """Accept a class/object or a ``"module:attr"`` import string."""
    return load_object(target) if isinstance(target, str) else target


def _make_dirs(rollout_dir: Path) -> Path:
    # 0700 whatever the umask, like every file of the trial (0600). The usual case, a new
    # rollout directory under an existing root, costs two mkdir calls and the marker's write.
    base = os.fspath(rollout_dir)
    created = make_private_dirs(base)
    artifacts = os.path.join(base, "artifacts")
    make_private_dirs(artifacts)
    marker = os.path.join(base, HEALTH_CHECK_MARKER)
    if created or not os.path.exists(marker):
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, _MARKER_CONTENT)
        finally:
            os.close(fd)
    return Path(artifacts)


def _graded(sample: RolloutSample) -> ExecutionResult:
    if sample.reward is None and not sample.remove_sample:
        raise ValueError("Sample has no reward after grading")
    return ExecutionResult(status=RolloutStatus.SUCCESS, sample=sample)


class LocalBackend(ExecutionBackend):
    """Run ``workflow`` (and ``grader``) in this process.

    ``workflow`` and ``grader`` are classes (or ``"module:attr"`` strings); one instance of
    each is created per rollout, the workflow with a deep copy of ``workflow_config``.
    ``max_concurrent`` bounds how many rollouts run at once (default 4; ``None`` means
    unbounded); the rest wait for a slot, and time spent waiting comes out of the agent budget.
    ``chat_endpoint`` (``{"environment": str, "requires_public_url": bool}``) is advertised on
    ``/health`` when given.
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]] | str,
        grader: type[Grader] | str | None = None,
        *,
        workflow_config: Any = None,
        grader_config: Any = None,
        max_concurrent: int | None = _UNSET,
        chat_endpoint: dict[str, Any] | None = None,
    ) -> None:
        self.workflow_cls: type[AgentWorkflow[Any]] = _resolve(workflow)
        self.grader_cls: type[Grader] | None = _resolve(grader) if grader is not None else None
        self.workflow_config = _resolve(workflow_config)
        self.grader_config = _resolve(grader_config)
        if max_concurrent is _UNSET:
            max_concurrent = self._config_concurrency()
        if max_concurrent is not None and (
            isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int)
        ):
            raise ValueError("max_concurrent must be a positive int or None")
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError("max_concurrent must be a positive int or None")
        self.max_concurrent: int | None = max_concurrent
        self._slots = trio.Semaphore(max_concurrent) if max_concurrent is not None else None
        self._queued = 0
        self._running = 0
        self.chat_endpoint = chat_endpoint

    def _config_concurrency(self) -> int | None:
        # Like the reference: 4 without a workflow config, else config.concurrency.max_concurrent.
        if self.workflow_config is None:
            return 4
        concurrency = getattr(self.workflow_config, "concurrency", None)
        if isinstance(concurrency, dict):
            return concurrency.get("max_concurrent")
        return getattr(concurrency, "max_concurrent", None)

    def health(self) -> dict[str, Any]:
        """``status`` and ``concurrency {max_concurrent, queued, running}``."""
        payload: dict[str, Any] = {
            "status": "ok",
            "concurrency": {
                "max_concurrent": self.max_concurrent,
                "queued": self._queued,
                "running": self._running,
            },
        }
        if self.chat_endpoint is not None:
            payload["chat_endpoint"] = dict(self.chat_endpoint)
        return payload

    async def _prepare_dirs(self, rollout_dir: Path | None) -> Path | None:
        if rollout_dir is None:
            return None
        for delay in (*_DIR_ATTEMPT_DELAYS, None):
            try:
                # Inline on purpose: two mkdirs and a 20-byte file land in the page cache in
                # microseconds, while a thread round trip costs ~0.4 ms of CPU per rollout
                # (measured; scripts/bench/bench_rollout_server.py).
                return _make_dirs(rollout_dir)
            except OSError:
                if delay is None:
                    return None
                await trio.sleep(delay)
        return None

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Wait for a slot, run the workflow under its deadline, then the grader (§9.2)."""
        artifacts_dir = await self._prepare_dirs(request.rollout_dir)
        queued_at = trio.current_time()
        self._queued += 1
        acquired = False
        try:
            if self._slots is not None:
                await self._slots.acquire()
                acquired = True
        finally:
            self._queued -= 1
        self._running += 1
        try:
            queued_for = trio.current_time() - queued_at
            workflow_result = await self._run_workflow(request, artifacts_dir, queued_for)
            if not request.grade or workflow_result.status != RolloutStatus.SUCCESS:
                return ExecutionOutcome(workflow=workflow_result)
            grader_result = await self._run_grader(request, artifacts_dir, workflow_result)
            return ExecutionOutcome(workflow=workflow_result, grader=grader_result)
        finally:
            self._running -= 1
            if acquired and self._slots is not None:
                self._slots.release()

    async def _run_workflow(
        self, request: ExecutionRequest, artifacts_dir: Path | None, queued_for: float
    ) -> ExecutionResult:
        limit = request.agent_timeout_sec
        deadline = math.inf if limit is None else trio.current_time() + max(limit - queued_for, 0)
        ctx = AgentWorkflowContext(
            prompt=request.prompt,
            config=copy.deepcopy(self.workflow_config),
            metadata=request.metadata,
            artifacts_dir=artifacts_dir,
        )
        try:
            workflow = self.workflow_cls(ctx.config)
            if limit is None:
                # No deadline, so no cancel scope: entering and leaving one is a measurable
                # share of a short rollout's CPU.
                output = await workflow.run(ctx)
                sample = await self._to_sample(output, request)
                return ExecutionResult(status=RolloutStatus.SUCCESS, sample=sample)
            with trio.move_on_at(deadline):
                output = await workflow.run(ctx)
                if trio.current_time() < deadline:
                    sample = await self._to_sample(output, request)
                    return ExecutionResult(status=RolloutStatus.SUCCESS, sample=sample)
        except (Exception, SystemExit) as raised:
            exc = _as_error(raised, "workflow")
            return ExecutionResult(
                status=RolloutStatus.FAILURE,
                err_message=str(exc) or type(exc).__name__,
                err_category=_categorize(exc),
                extra_fields={FAILURE_KEY: describe_exception(exc, "agent")},
            )
        # The deadline fired, or the workflow returned after it (swallowed the cancellation).
        message = f"workflow exceeded its {float(limit or 0.0)}s deadline"
        if queued_for >= 0.1:
            message += f" ({queued_for:.1f}s of it spent queued)"
        return ExecutionResult(
            status=RolloutStatus.FAILURE,
            err_message=message,
            err_category=RolloutErrorCategory.TIMEOUT,
            extra_fields={FAILURE_KEY: {"phase": "agent"}},
        )

    async def _to_sample(self, output: Any, request: ExecutionRequest) -> RolloutSample | None:
        if isinstance(output, AgentWorkflowOutput):
            if output.messages is None:
                return None
            return RolloutSample(output.messages, label=request.label, metrics=output.metrics)
        if isinstance(output, list):
            return RolloutSample(output, label=request.label)
        if output is None:
            ctx = get_rollout_context()
            return await ctx.get_sample() if ctx is not None else None
        raise TypeError(
            "run() must return AgentWorkflowOutput, a message list, or None; "
            f"got {type(output).__name__}"
        )

    async def _run_grader(
        self, request: ExecutionRequest, artifacts_dir: Path | None, workflow: ExecutionResult
    ) -> ExecutionResult:
        if self.grader_cls is None or (request.label is None and request.metadata is None):
            # The reference reports a bare failure here (docs/spec/protocol.md §9.2, §19 item 7);
            # the reason goes only to diagnostics.json, where the wire cannot see it.
            return ExecutionResult(
                status=RolloutStatus.FAILURE,
                extra_fields={FAILURE_KEY: {"phase": "grader", "message": _NO_GRADER}},
            )
        ctx = get_rollout_context()
        if ctx is not None:
            await ctx.set_status(RolloutStatus.GRADING)
        sample = workflow.sample
        limit = request.grader_timeout_sec
        deadline = math.inf if limit is None else trio.current_time() + limit
        grader_ctx = GraderContext(
            label=request.label,
            sample=sample,
            metadata=request.metadata,
            artifacts_dir=artifacts_dir,
        )
        try:
            if sample is None:
                raise ValueError(
                    "No sample to grade. The workflow returned no messages and registered "
                    "no sample source."
                )
            grader = self.grader_cls(self.grader_config)
            if limit is None:
                await grader.grade(grader_ctx)
                return _graded(sample)
            with trio.move_on_at(deadline):
                await grader.grade(grader_ctx)
                if trio.current_time() < deadline:
                    return _graded(sample)
        except (Exception, SystemExit) as raised:
            exc = _as_error(raised, "grader")
            return ExecutionResult(
                status=RolloutStatus.FAILURE,
                sample=sample,
                err_message=str(exc) or type(exc).__name__,
                err_category=_categorize(exc),
                extra_fields={FAILURE_KEY: describe_exception(exc, "grader")},
            )
        return ExecutionResult(
            status=RolloutStatus.FAILURE,
            sample=sample,
            err_message=f"grader exceeded its {float(limit or 0.0)}s deadline",
            err_category=RolloutErrorCategory.TIMEOUT,
            extra_fields={FAILURE_KEY: {"phase": "grader"}},
        )


def _as_error(raised: BaseException, who: str) -> Exception:
    """What a workflow or grader raised, as the rollout's failure: a ``sys.exit()`` in one ends
    that rollout (and says so), not the server with every rollout on it."""
    if isinstance(raised, SystemExit):
        return RuntimeError(f"the {who} called sys.exit({raised.code!r})")
    assert isinstance(raised, Exception)
    return raised
