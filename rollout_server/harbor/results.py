"""Turning a trial's ``result.json`` into an :class:`ExecutionOutcome`.

Harbor exits 0 even when a trial failed, so the outcome comes from ``result.json`` alone: the
reward from the verifier's ``reward`` channel (Harbor's convention; no other channel is guessed),
the failure category from ``exception_info.exception_type``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..backend import ExecutionOutcome, ExecutionResult
from ..protocol import RolloutErrorCategory, RolloutStatus
from ..sdk import RolloutSample

__all__ = ["CANCELLED_TYPES", "outcome_from_result", "read_result"]

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


def read_result(trial_dir: Path) -> dict[str, Any] | None:
    """The parsed ``result.json`` of ``trial_dir``, or ``None`` when absent or unreadable."""
    try:
        document = json.loads((trial_dir / "result.json").read_bytes())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


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
                    extra_fields=extra,
                ),
            )
        if kind in _AGENT_PHASE_TIMEOUTS:
            category = RolloutErrorCategory.TIMEOUT
        elif kind in _ENVIRONMENT_ERRORS:
            category = RolloutErrorCategory.INTERNAL_ERROR
        else:
            category = RolloutErrorCategory.AGENT_ERROR
        return ExecutionOutcome(
            ExecutionResult(
                RolloutStatus.FAILURE,
                err_message=message,
                err_category=category,
                extra_fields=extra,
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
