"""Turning a trial's ``result.json`` into an :class:`ExecutionOutcome`.

Harbor exits 0 even when a trial failed, so the outcome comes from ``result.json`` alone: the
reward from the verifier's ``reward`` channel (Harbor's convention; no other channel is guessed),
the failure category from ``exception_info.exception_type``. In workflow mode the container's
own result files come first: ``agent/container_result.json`` (the workflow's messages, or its
failure) and ``verifier/grade_result.json`` (the Grader's failure), so a user's exception is the
row's reason rather than the Harbor error it caused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..backend import FAILURE_KEY, ExecutionOutcome, ExecutionRequest, ExecutionResult
from ..protocol import RolloutErrorCategory, RolloutStatus
from ..sdk import RolloutSample
from .archive import log_tail, scrub_bytes, secret_spellings
from .atif import agent_messages, with_agent_messages
from .taskimage import build_failure_cause

__all__ = [
    "CANCELLED_TYPES",
    "failed",
    "outcome_from_result",
    "read_container_result",
    "read_json",
    "read_result",
    "sandbox_outcome",
    "trial_outcome",
    "workflow_outcome",
]

#: Exception types that mean the trial was interrupted, not that it failed.
CANCELLED_TYPES = frozenset({"CancelledError", "KeyboardInterrupt"})
_AGENT_PHASE_TIMEOUTS = frozenset(
    {"AgentTimeoutError", "AgentSetupTimeoutError", "EnvironmentStartTimeoutError"}
)
_VERIFIER_ERRORS = frozenset(
    {
        "VerifierTimeoutError",
        "RewardFileNotFoundError",
        "RewardFileEmptyError",
        "VerifierOutputParseError",
        "AddTestsDirError",
        "DownloadVerifierDirError",
    }
)
_ENVIRONMENT_ERRORS = frozenset(
    {"SandboxBuildFailedError", "HealthcheckError", "ServiceOperationsUnsupportedError"}
)
_TOKEN_FIELDS = ("n_input_tokens", "n_output_tokens", "n_cache_tokens")
#: Harbor's message for a failed ``compose build`` (harbor 0.25 ``_run_docker_compose_command``):
#: the cause is at the end of a long command line, in the build's output.
_COMPOSE_BUILD_FAILED = re.compile(
    r"Docker compose command failed .*? build\. Return code: -?\d+\. Stdout: (.*)\. Stderr: (.*)\.",
    re.DOTALL,
)
#: The line a Python traceback ends with: the exception raised.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(: .*)?$")
#: LiteLLM's exceptions for an error answer (a host-side agent such as terminus-2 calls the
#: bridge through LiteLLM), with the HTTP status each stands for.
_MODEL_CALL_STATUS = {
    "BadRequestError": 400,
    "AuthenticationError": 401,
    "PermissionDeniedError": 403,
    "NotFoundError": 404,
    "UnprocessableEntityError": 422,
    "RateLimitError": 429,
    "InternalServerError": 500,
    "BadGatewayError": 502,
    "ServiceUnavailableError": 503,
}


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when absent, unreadable or not an object."""
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def read_result(trial_dir: Path) -> dict[str, Any] | None:
    """The parsed ``result.json`` of ``trial_dir``, or ``None`` when absent or unreadable."""
    return read_json(trial_dir / "result.json")


def read_container_result(trial_dir: Path, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The workflow's ``container_result.json``: the trial's ``agent/`` copy, else the one the
    harness put into the agent context's metadata."""
    document = read_json(trial_dir / "agent" / "container_result.json")
    if document is not None:
        return document
    agent = result.get("agent_result") if result else None
    metadata = agent.get("metadata") if isinstance(agent, dict) else None
    embedded = metadata.get("container_result") if isinstance(metadata, dict) else None
    return embedded if isinstance(embedded, dict) else None


def _diagnostics(result: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {"harbor_trial": result.get("trial_name")}
    for phase in ("environment_setup", "agent_setup", "agent_execution", "verifier"):
        timing = result.get(phase)
        if isinstance(timing, dict):
            fields[f"harbor_{phase}"] = timing
    exception = result.get("exception_info")
    if isinstance(exception, dict):
        fields["harbor_exception_type"] = exception.get("exception_type")
    return fields


def _before_the_agent(result: dict[str, Any]) -> bool:
    """Whether the trial failed while its environment was being set up: that phase began and
    neither the agent's setup nor its run did."""
    return (
        isinstance(result.get("environment_setup"), dict)
        and not result.get("agent_setup")
        and not result.get("agent_execution")
    )


def _metrics(result: dict[str, Any]) -> dict[str, float]:
    # Fallback only: the bridge's counts are authoritative and are added by the supervisor.
    agent = result.get("agent_result")
    metrics: dict[str, float] = {}
    if isinstance(agent, dict):
        for name in _TOKEN_FIELDS:
            value = agent.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[f"harbor_{name}"] = float(value)
    return metrics


def _reward(result: dict[str, Any]) -> float | None:
    verifier = result.get("verifier_result")
    rewards = verifier.get("rewards") if isinstance(verifier, dict) else None
    value = rewards.get("reward") if isinstance(rewards, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def outcome_from_result(
    result: dict[str, Any],
    *,
    prompt: list[dict[str, Any]],
    label: str | None,
    grade: bool,
) -> ExecutionOutcome:
    """The outcome a finished trial reports (``cancelled`` when Harbor was interrupted)."""
    extra = _diagnostics(result)
    sample = RolloutSample(list(prompt), label=label, metrics=_metrics(result))
    exception = result.get("exception_info")
    if isinstance(exception, dict):
        kind = str(exception.get("exception_type") or "Exception")
        message = f"{kind}: {exception.get('exception_message') or ''}".rstrip(": ")
        build = _COMPOSE_BUILD_FAILED.search(message)
        if build is not None:
            # The cause first, on one line; Harbor's whole message stays in the archived trial.
            cause = build_failure_cause("\n".join(build.groups()))
            message = f"task image build failed: {cause}"
        if kind in CANCELLED_TYPES:
            return ExecutionOutcome(
                ExecutionResult(RolloutStatus.CANCELLED, err_message=message, extra_fields=extra)
            )
        if kind in _VERIFIER_ERRORS:
            category = (
                RolloutErrorCategory.TIMEOUT
                if kind == "VerifierTimeoutError"
                else RolloutErrorCategory.AGENT_ERROR
            )
            return ExecutionOutcome(
                ExecutionResult(RolloutStatus.SUCCESS, sample=sample, extra_fields=extra),
                ExecutionResult(
                    RolloutStatus.FAILURE,
                    sample=sample,
                    err_message=message,
                    err_category=category,
                    extra_fields={**extra, FAILURE_KEY: {"phase": "grader", "type": kind}},
                ),
            )
        # Where it happened, for the reason shown (``agent: AgentTimeoutError: …``): the
        # sandbox's environment is the server's side, anything else the agent's.
        phase = "agent"
        failure: dict[str, Any] = {}
        status = _MODEL_CALL_STATUS.get(kind)
        if status is not None and "litellm." in message:
            # The agent's own LiteLLM raised it on a model call: the bridge (or the provider
            # behind it) answered an error, as a workflow's ChatError says.
            phase = "bridge"
            failure["status"] = status
        if kind in _AGENT_PHASE_TIMEOUTS:
            category = RolloutErrorCategory.TIMEOUT
        elif kind in _ENVIRONMENT_ERRORS or _before_the_agent(result):
            # A sandbox that could not be built or started (Harbor on podman raises a bare
            # RuntimeError for a failed `compose build`/`up`): the agent never ran.
            category = RolloutErrorCategory.INTERNAL_ERROR
            phase = "server"
        else:
            category = RolloutErrorCategory.AGENT_ERROR
        return ExecutionOutcome(
            ExecutionResult(
                RolloutStatus.FAILURE,
                err_message=message,
                err_category=category,
                extra_fields={**extra, FAILURE_KEY: {"phase": phase, "type": kind, **failure}},
            )
        )
    workflow = ExecutionResult(RolloutStatus.SUCCESS, sample=sample, extra_fields=extra)
    if not grade:
        return ExecutionOutcome(workflow)
    reward = _reward(result)
    if reward is None:
        return ExecutionOutcome(
            workflow,
            ExecutionResult(
                RolloutStatus.FAILURE,
                sample=sample,
                err_message="trial ended without a 'reward' in its verifier result",
                err_category=RolloutErrorCategory.AGENT_ERROR,
                extra_fields=extra,
            ),
        )
    graded = RolloutSample(list(prompt), label=label, reward=reward, metrics=sample.metrics)
    return ExecutionOutcome(
        workflow, ExecutionResult(RolloutStatus.SUCCESS, sample=graded, extra_fields=extra)
    )


_VALIDATION_TYPES = frozenset({"ValueError", "TypeError", "AssertionError", "KeyError"})
_TIMEOUT_TYPES = frozenset({"TimeoutError", "TooSlowError"})


def _failure_category(failure: dict[str, Any]) -> RolloutErrorCategory:
    detail = failure.get("detail")
    if isinstance(detail, dict) and detail.get("phase") == "bridge":
        return RolloutErrorCategory.AGENT_ERROR
    kind = failure.get("type")
    if kind in _TIMEOUT_TYPES:
        return RolloutErrorCategory.TIMEOUT
    if kind in _VALIDATION_TYPES:
        return RolloutErrorCategory.VALIDATION_ERROR
    return RolloutErrorCategory.AGENT_ERROR


def _container_failure(
    failure: Any, who: str, scrub: Callable[[str], str], extra: dict[str, Any]
) -> ExecutionResult:
    """The user's exception in the sandbox, reported as LocalBackend reports it: the message as
    ``err_message``, the phase and type in the diagnostics' failure (plus the runner's stage)."""
    failure = failure if isinstance(failure, dict) else {}
    stage = str(failure.get("stage") or who)
    kind = str(failure.get("type") or "Error")
    message = scrub(str(failure.get("message") or "")) or kind
    if stage not in (who, "grader", "workflow"):
        message = f"{stage}: {message}"
    detail = failure.get("detail")
    reason: dict[str, Any] = dict(detail) if isinstance(detail, dict) else {}
    reason.setdefault("phase", "grader" if who == "grader" else "agent")
    reason.setdefault("type", kind)
    if "message" in reason:
        reason["message"] = scrub(str(reason["message"]))
    reason["stage"] = stage
    return ExecutionResult(
        RolloutStatus.FAILURE,
        err_message=message,
        err_category=_failure_category(failure),
        extra_fields={**extra, FAILURE_KEY: reason},
    )


def workflow_outcome(
    result: dict[str, Any],
    container: dict[str, Any] | None,
    grade_result: dict[str, Any] | None,
    *,
    prompt: list[dict[str, Any]],
    label: str | None,
    grade: bool,
    scrub: Callable[[str], str],
) -> ExecutionOutcome:
    """The outcome of a workflow-mode trial: the container's own results first (``scrub``
    cleans the user's error text of secrets), Harbor's reward channel for the reward."""
    exception = result.get("exception_info")
    kind = exception.get("exception_type") if isinstance(exception, dict) else None
    if container is None or kind in CANCELLED_TYPES:
        outcome = outcome_from_result(result, prompt=prompt, label=label, grade=grade)
        if container is None and outcome.workflow.status == RolloutStatus.SUCCESS:
            return ExecutionOutcome(
                ExecutionResult(
                    RolloutStatus.FAILURE,
                    err_message="the workflow wrote no container_result.json",
                    err_category=RolloutErrorCategory.AGENT_ERROR,
                    extra_fields=_diagnostics(result),
                )
            )
        return outcome
    extra = _diagnostics(result)
    if container.get("status") != "success":
        return ExecutionOutcome(
            _container_failure(container.get("failure"), "workflow", scrub, extra)
        )
    messages = container.get("messages")
    metrics = dict(_metrics(result))
    own = container.get("metrics")
    if isinstance(own, dict):
        metrics.update(own)
    sample = (
        RolloutSample(
            messages,
            label=label,
            metrics=metrics,
            remove_sample=bool(container.get("remove_sample")),
        )
        if isinstance(messages, list)
        else None
    )
    workflow = ExecutionResult(RolloutStatus.SUCCESS, sample=sample, extra_fields=extra)
    if not grade:
        return ExecutionOutcome(workflow)
    if grade_result is not None and grade_result.get("status") != "success":
        failed = _container_failure(grade_result.get("failure"), "grader", scrub, extra)
        failed.sample = sample
        return ExecutionOutcome(workflow, failed)
    reward = _reward(result)
    if reward is None:
        graded = outcome_from_result(result, prompt=prompt, label=label, grade=True).grader
        message = graded.err_message if graded is not None else None
        return ExecutionOutcome(
            workflow,
            ExecutionResult(
                RolloutStatus.FAILURE,
                sample=sample,
                err_message=scrub(
                    message or "trial ended without a 'reward' in its verifier result"
                ),
                err_category=graded.err_category
                if graded is not None
                else RolloutErrorCategory.AGENT_ERROR,
                extra_fields=extra,
            ),
        )
    if sample is None:
        sample = RolloutSample(list(prompt), label=label, metrics=metrics)
    sample.reward = reward
    if grade_result is not None and grade_result.get("remove_sample"):
        sample.remove_sample = True
    return ExecutionOutcome(
        workflow, ExecutionResult(RolloutStatus.SUCCESS, sample=sample, extra_fields=extra)
    )


def sandbox_outcome(
    trial_dir: Path,
    result: dict[str, Any],
    request: ExecutionRequest,
    secrets: Sequence[str],
    evidence: Mapping[str, Any],
) -> ExecutionOutcome:
    """:func:`workflow_outcome` from the trial dir's files, its text scrubbed of ``secrets``
    and ``evidence`` (route, image) added to each phase's diagnostics."""
    spellings = secret_spellings(secrets)

    def scrub(text: str) -> str:
        clean = scrub_bytes(text.encode(errors="replace"), spellings)
        return clean.decode(errors="replace") if clean is not None else "(withheld)"

    outcome = workflow_outcome(
        result,
        read_container_result(trial_dir, result),
        read_json(trial_dir / "verifier" / "grade_result.json"),
        prompt=request.prompt,
        label=request.label,
        grade=request.grade,
        scrub=scrub,
    )
    for phase in (outcome.workflow, outcome.grader):
        if phase is not None:
            phase.extra_fields = {**(phase.extra_fields or {}), **evidence}
    return outcome


def failed(message: str, category: RolloutErrorCategory) -> ExecutionOutcome:
    """A rollout that failed before (or outside) its trial."""
    return ExecutionOutcome(
        ExecutionResult(RolloutStatus.FAILURE, err_message=message, err_category=category)
    )


def _raised(log_path: Path, secrets: Sequence[str]) -> str | None:
    """The exception a Harbor process's log ends with (``FileNotFoundError: ...``), or None."""
    for line in reversed(log_tail(log_path, secrets, lines=40).split(" | ")):
        if _EXCEPTION_LINE.match(line.strip()):
            return line.strip()
    return None


def trial_outcome(
    trial_dir: Path,
    request: ExecutionRequest,
    returncode: int | None,
    log_path: Path,
    secrets: Sequence[str],
    evidence: Mapping[str, Any] | None,
) -> ExecutionOutcome:
    """The outcome of a finished ``harbor trial start`` (``evidence``: a workflow-mode trial's
    route and image, whose container results then come first)."""
    result = read_result(trial_dir)
    if result is None:
        raised = _raised(log_path, secrets)
        if raised is not None:
            # Harbor refused before the trial began (a task it cannot load, say): that first.
            message = f"{raised} (Harbor exited with code {returncode} before writing result.json)"
        else:
            message = (
                f"Harbor trial {trial_dir.name} wrote no result.json (exit code {returncode}): "
                + log_tail(log_path, secrets)
            )
        return failed(message, RolloutErrorCategory.INTERNAL_ERROR)
    if evidence is None:
        # A host-side agent: its turns are in its ATIF trajectory (harbor.atif).
        outcome = outcome_from_result(
            result, prompt=request.prompt, label=request.label, grade=request.grade
        )
        messages = agent_messages(trial_dir, secrets)
        workflow = outcome.workflow
        if messages and workflow.status == RolloutStatus.FAILURE and workflow.sample is None:
            # A trial that failed (timed out, say) after turns: they are the row's record of
            # what the agent did, as a grader's failure keeps its sample.
            workflow.sample = RolloutSample(list(request.prompt), label=request.label)
        return with_agent_messages(outcome, messages)
    return sandbox_outcome(trial_dir, result, request, secrets, evidence)
