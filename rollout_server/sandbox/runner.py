"""The two in-sandbox steps: ``agent`` runs the workflow, ``grade`` runs the grader.

Both always leave a result file saying what happened (a failure names its stage, the
exception's type and message), so the host reports the user's error rather than a Harbor one.
Run with ``python -m rollout_server.sandbox agent|grade``; see the package docstring for the
files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from ..backend import describe_exception, load_object
from ..protocol import ENV_API_KEY, ENV_CHAT_COMPLETIONS_URL, ENV_ROLLOUT_ID
from ..sdk import (
    AgentWorkflowContext,
    AgentWorkflowOutput,
    GraderContext,
    RolloutContext,
    RolloutSample,
    set_rollout_context,
)
from . import ARTIFACTS_DIR, GRADE_RESULT_PATH, INPUT_PATH, LABEL_PATH, RESULT_PATH, REWARD_PATH

__all__ = ["decode_config", "load_object", "run_agent", "run_grade", "use_package_dir"]


class StageError(Exception):
    """A failure of the runner itself (bad input, missing file), with the stage it hit."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def use_package_dir(name: str | None) -> None:
    """Put the directory of package ``name`` (the rollout's files) first on ``sys.path``.

    The bundle installs the rollout project as that package, so ``import main`` works in the
    container as it does in the rollout's own directory.
    """
    if not name:
        return
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise StageError("import", f"the rollout package {name!r} is not installed in the image")
    for location in reversed(locations):
        if location not in sys.path:
            sys.path.insert(0, location)


def decode_config(value: Any, type_path: str | None) -> Any:
    """The config as the workflow expects it: the JSON itself, or the dataclass rebuilt."""
    if type_path is None or value is None:
        return value
    cls: Any = load_object(type_path)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or not isinstance(value, dict):
        raise TypeError(f"config type {type_path} is not a dataclass taking the stored fields")
    return cls(**value)


def _failure(stage: str, exc: BaseException) -> dict[str, Any]:
    detail = describe_exception(exc, "grader" if stage == "grader" else "agent")
    return {
        "stage": getattr(exc, "stage", stage),
        "type": type(exc).__name__,
        "message": str(exc) or type(exc).__name__,
        "detail": detail,
    }


def _write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(document, handle, default=_jsonable, allow_nan=False)
    os.replace(temporary, path)


def _jsonable(value: Any) -> Any:
    # Messages built with an SDK's own types (pydantic models, dataclasses) keep their data.
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _read_json(path: Path, stage: str) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise StageError(stage, f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise StageError(stage, f"{path} is unreadable: {exc}") from None
    if not isinstance(document, dict):
        raise StageError(stage, f"{path} is not a JSON object")
    return document


def _take_input(path: Path) -> dict[str, Any]:
    try:
        return _read_json(path, "input")
    finally:
        # The file holds the bearer: gone as soon as it was read, whatever happens next.
        with contextlib.suppress(OSError):
            path.unlink()


def _make_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.mkdir(parents=True, exist_ok=True)


def _finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {
        str(name): float(value)
        for name, value in metrics.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    }


async def _output_document(output: Any, ctx: RolloutContext) -> dict[str, Any]:
    """What the workflow returned, in the shape the host rebuilds a sample from."""
    if isinstance(output, AgentWorkflowOutput):
        return {"messages": output.messages, "metrics": _finite_metrics(output.metrics)}
    if isinstance(output, list):
        return {"messages": output, "metrics": {}}
    if output is None:
        sample = await ctx.get_sample()
        if sample is None:
            return {"messages": None, "metrics": {}}
        return {
            "messages": sample.messages,
            "metrics": _finite_metrics(sample.metrics),
            "remove_sample": sample.remove_sample,
        }
    raise TypeError(
        "run() must return AgentWorkflowOutput, a message list, or None; "
        f"got {type(output).__name__}"
    )


def _export_endpoint(url: str, api_key: str | None, rollout_id: str) -> None:
    """Point the official ``openai`` client (and subprocesses) at the rollout's endpoint.

    ``openai`` appends ``/chat/completions`` to ``OPENAI_BASE_URL``, which is exactly the
    rollout's URL form.
    """
    os.environ["OPENAI_BASE_URL"] = url
    os.environ[ENV_CHAT_COMPLETIONS_URL] = url
    os.environ[ENV_ROLLOUT_ID] = rollout_id
    if api_key:
        os.environ["OPENAI_API_KEY"] = api_key
        os.environ[ENV_API_KEY] = api_key


async def run_agent(
    input_path: Path = Path(str(INPUT_PATH)),
    result_path: Path = Path(str(RESULT_PATH)),
    artifacts_dir: Path | None = Path(str(ARTIFACTS_DIR)),
) -> int:
    """Read the input (and delete it), run the workflow, write the result. 0 when it succeeded."""
    stage = "input"
    try:
        document = _take_input(input_path)
        url = str(document.get("chat_completions_url") or "")
        api_key = document.get("api_key") or None
        rollout_id = str(document.get("rollout_id") or "")
        if not url:
            raise StageError(stage, "the input has no chat_completions_url")
        _export_endpoint(url, api_key, rollout_id)
        stage = "import"
        use_package_dir(document.get("package_dir_name"))
        workflow_cls = load_object(str(document.get("workflow") or ""))
        stage = "config"
        config = decode_config(document.get("config"), document.get("config_type"))
        stage = "workflow"
        ctx = RolloutContext(chat_completions_url=url, api_key=api_key, rollout_id=rollout_id)
        set_rollout_context(ctx)
        if artifacts_dir is not None:
            _make_dir(artifacts_dir)
        workflow_ctx: AgentWorkflowContext[Any] = AgentWorkflowContext(
            prompt=list(document.get("prompt") or []),
            config=config,
            metadata=document.get("metadata"),
            artifacts_dir=artifacts_dir,
        )
        timeout = float(document.get("timeout_sec") or 0.0)
        deadline = math.inf if timeout <= 0 else trio.current_time() + timeout
        workflow = workflow_cls(config)
        with trio.move_on_at(deadline):
            output = await workflow.run(workflow_ctx)
        if trio.current_time() >= deadline:
            raise TimeoutError(f"workflow exceeded its {timeout}s deadline")
        stage = "result"
        result = {"status": "success", **await _output_document(output, ctx), "failure": None}
        _write_json(result_path, result)
        return 0
    except Exception as exc:
        failure = _failure(stage, exc)
        _write_json(result_path, {"status": "failure", "messages": None, "failure": failure})
        return 1


def _sample_from(result: Mapping[str, Any], label: str | None) -> RolloutSample | None:
    messages = result.get("messages")
    if not isinstance(messages, list):
        return None
    metrics = result.get("metrics")
    return RolloutSample(
        messages,
        label=label,
        metrics=dict(metrics) if isinstance(metrics, dict) else None,
        remove_sample=bool(result.get("remove_sample")),
    )


async def run_grade(
    result_path: Path = Path(str(RESULT_PATH)),
    label_path: Path = Path(str(LABEL_PATH)),
    reward_path: Path = Path(str(REWARD_PATH)),
    grade_result_path: Path = Path(str(GRADE_RESULT_PATH)),
    artifacts_dir: Path | None = Path(str(ARTIFACTS_DIR)),
) -> int:
    """Grade the agent step's sample against the staged label; write Harbor's reward file.

    With no reward (a failure), ``reward.json`` is not written, so Harbor records the trial's
    verification as failed and ``grade_result.json`` says why.
    """
    stage = "grader"
    try:
        staged = _read_json(label_path, "label")
        result = _read_json(result_path, "result")
        if result.get("status") != "success":
            raise StageError("result", "the workflow did not succeed; nothing to grade")
        label = staged.get("label")
        label = label if isinstance(label, str) else None
        sample = _sample_from(result, label)
        if sample is None:
            raise ValueError(
                "No sample to grade. The workflow returned no messages and registered "
                "no sample source."
            )
        stage = "import"
        use_package_dir(staged.get("package_dir_name"))
        grader_cls = load_object(str(staged.get("grader") or ""))
        config = decode_config(staged.get("grader_config"), staged.get("grader_config_type"))
        stage = "grader"
        grader = grader_cls(config)
        await grader.grade(
            GraderContext(
                label=label,
                sample=sample,
                metadata=staged.get("metadata"),
                artifacts_dir=artifacts_dir,
            )
        )
        if sample.reward is None and not sample.remove_sample:
            raise ValueError("Sample has no reward after grading")
        reward = sample.reward if sample.reward is not None else 0.0
        _write_json(reward_path, {"reward": reward})
        _write_json(
            grade_result_path,
            {
                "status": "success",
                "reward": sample.reward,
                "remove_sample": sample.remove_sample,
                "failure": None,
            },
        )
        return 0
    except Exception as exc:
        _write_json(grade_result_path, {"status": "failure", "failure": _failure(stage, exc)})
        return 1
