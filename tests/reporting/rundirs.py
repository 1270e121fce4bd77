"""Write run directories file by file (the layout a real run leaves), for tests and the
report benchmark: manifest.json, metrics.json, index.jsonl, events.jsonl, dataset_rows.jsonl,
rollout_trials/<id>/trajectory.json (+ diagnostics.json) and logs.txt.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

__all__ = ["hand_summary", "synthetic_items", "write_run"]


def _trajectory(rollout_id: str, prompt: str, reply: str, tool: bool) -> dict[str, Any]:
    agent: dict[str, Any] = {"step_id": 2, "source": "agent", "message": reply}
    steps: list[dict[str, Any]] = [{"step_id": 1, "source": "user", "message": prompt}, agent]
    if tool:
        agent["tool_calls"] = [
            {"tool_call_id": "call_1", "function_name": "lookup", "arguments": {"q": prompt[:20]}}
        ]
        agent["observation"] = {"results": [{"source_call_id": "call_1", "content": "42"}]}
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": {"name": "osmosis-rollout-sdk", "version": "0.1.0"},
        "steps": steps,
        "final_metrics": {"total_steps": len(steps)},
        "extra": {"osmosis": {"rollout_id": rollout_id}},
    }


def hand_summary(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``metrics.json`` summary of ``items`` counted directly (threshold 1.0; rewards are
    0 or 1, so mean, median and std have closed forms), independent of the launcher."""
    scored = [i for i in items if i["status"] != "skipped"]
    rewards = [i["reward"] for i in scored if i.get("reward") is not None]
    passed = sum(1 for r in rewards if r >= 1.0)
    mean = passed / len(rewards)
    return {
        "total_samples": len(items),
        "completed_samples": len(scored),
        "graded": len(rewards),
        "passed": passed,
        "failed": sum(1 for i in items if i["status"] == "failed"),
        "skipped": len(items) - len(scored),
        "pass_rate": passed / len(scored),
        "pass_threshold": 1.0,
        "tokens_used": sum(i.get("tokens") or 0 for i in items),
        "reward_stats": {
            "mean": mean,
            "median": 1.0 if mean > 0.5 else 0.0,
            "std": (mean * (1 - mean)) ** 0.5,
            "min": min(rewards),
            "max": max(rewards),
        },
    }


def write_run(
    run_dir: Path,
    items: list[dict[str, Any]],
    *,
    name: str | None = None,
    sha256: str = "ab" * 32,
    rows: str | None = None,
    metrics_summary: dict[str, Any] | None = None,
    status: str = "finished",
    log: str = "2026-01-01T00:00:00Z INFO [run] started\n",
) -> Path:
    """Write a run directory holding ``items`` (index rows plus optional ``prompt``,
    ``label``, ``reply``, ``tool``, ``diagnostics`` and ``error`` keys)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = name or run_dir.name
    n_rows = len({i["row_index"] for i in items})
    manifest = {
        "schema_version": 1,
        "local_run_id": "0" * 32,
        "run_name": name,
        "created_at": "2026-01-01T00:00:00Z",
        "inputs": {
            "model_path": "rollbridge/echo",
            "dataset": {"sha256": sha256, "selected_source_rows": rows or f"0-{n_rows - 1}"},
            "n": 1 + max(i["run_index"] for i in items),
            "rollout": {"name": "echo", "entrypoint": "main.py", "source_digest": "cd" * 32},
            "env": {},
            "secret_names": [],
            "timeouts": {"agent_timeout_sec": 60.0, "grader_timeout_sec": 30.0},
            "versions": {"rollout_protocol": "0.4", "dataset_normalization": 1, "state_schema": 1},
        },
        "provenance": {"sdk_version": "0.1.0"},
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    metrics: dict[str, Any] = {
        "eval_run": {"id": "0" * 32, "status": status, "name": name, "duration_ms": 1234.5},
    }
    metrics["summary"] = metrics_summary if metrics_summary is not None else hand_summary(items)
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    index_lines, dataset_lines, journal_lines = [], {}, []
    for item in items:
        row = {
            k: item[k]
            for k in (
                "row_index",
                "run_index",
                "rollout_id",
                "status",
                "reward",
                "tokens",
                "max_context_tokens",
                "duration_ms",
                "error_type",
                "error",
            )
            if item.get(k) is not None
        }
        trial = run_dir / "rollout_trials" / item["rollout_id"]
        (trial / "artifacts").mkdir(parents=True, exist_ok=True)
        prompt = item.get("prompt", f"prompt {item['row_index']}")
        if item.get("reply") is not None:
            doc = _trajectory(item["rollout_id"], prompt, item["reply"], bool(item.get("tool")))
            (trial / "trajectory.json").write_text(json.dumps(doc))
            row = {"trajectory_filename": "trajectory.json", **row}
        if item.get("diagnostics") is not None:
            (trial / "diagnostics.json").write_text(json.dumps(item["diagnostics"]))
        index_lines.append(json.dumps(row, ensure_ascii=False))
        journal_lines.append(json.dumps(row, sort_keys=True, ensure_ascii=False))
        line = {"row_index": item["row_index"], "prompt": prompt}
        if item.get("label") is not None:
            line["label"] = item["label"]
        dataset_lines[item["row_index"]] = json.dumps(line, ensure_ascii=False)
    (run_dir / "index.jsonl").write_text("".join(f"{x}\n" for x in index_lines))
    (run_dir / "events.jsonl").write_text("".join(f"{x}\n" for x in journal_lines))
    (run_dir / "dataset_rows.jsonl").write_text(
        "".join(f"{dataset_lines[k]}\n" for k in sorted(dataset_lines))
    )
    (run_dir / "logs.txt").write_text(log)
    return run_dir


def synthetic_items(count: int, *, seed: int = 7, fail_every: int = 9) -> list[dict[str, Any]]:
    """``count`` plausible items: mostly graded, every ``fail_every``-th failed with an error
    object, a few skipped; tokens and context spread over a long tail."""
    rng = random.Random(seed)
    items = []
    for i in range(count):
        status = "failed" if i % fail_every == 3 else "skipped" if i % 97 == 5 else "success"
        tokens = int(rng.lognormvariate(6, 0.8))
        item: dict[str, Any] = {
            "row_index": i,
            "run_index": 0,
            "rollout_id": f"{i:032x}",
            "status": status,
            "tokens": tokens,
            "max_context_tokens": max(1, tokens - rng.randint(0, tokens // 2 + 1)),
            "duration_ms": rng.uniform(50, 5000),
            "prompt": f"Question {i}: what is {i} plus {i}?",
            "label": str(2 * i),
            "reply": f"The answer is {2 * i if rng.random() < 0.7 else i}.",
            "tool": i % 5 == 0,
        }
        if status == "success":
            item["reward"] = 1.0 if str(2 * i) in item["reply"] else 0.0
        if status == "failed":
            item["error_type"] = "timeout" if i % 2 else "validation_error"
            item["error"] = {
                "phase": "grader" if i % 2 == 0 else "agent",
                "type": "TimeoutError" if i % 2 else "ValueError",
                "message": f"item {i} failed: deadline of 60 s exceeded"
                if i % 2
                else f"item {i}: grader raised ValueError",
            }
        items.append(item)
    return items
