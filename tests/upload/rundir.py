"""A finished run directory as ``rollbridge eval run`` leaves it, written file by file for the
upload tests: what the upload sends (index, progress, logs, trajectories, artifacts at any
depth, one large enough for a multipart upload) and everything it must leave behind (the
journal, metrics, summary, projection copies, control files, per-trial logs and Harbor
evidence, a superseded attempt, dataset_rows.jsonl, the artifacts' own manifest).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from rollout_server.sdk import RolloutSample
from rollout_server.trajectory import build_trajectory

__all__ = ["SENT", "make_workspace", "write_finished_run"]

#: Upload paths every run written here sends besides trajectories and artifacts.
SENT = ("index.jsonl", "logs.txt", "progress.json")


def make_workspace(root: Path, origin: str = "https://github.com/Acme/Rollouts.git") -> Path:
    """A workspace directory as both CLIs expect it: the scaffold directories, a git work tree
    whose ``origin`` is on github.com."""
    import subprocess

    for sub in ("rollouts", "configs/eval", "configs/training", "data"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "remote", "add", "origin", origin], check=True)
    return root


def _rollout_id(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


def write_finished_run(
    output_root: Path,
    name: str = "quiet-otter-7",
    *,
    rows: int = 3,
    n: int = 2,
    big_artifact: int = 300_000,
    log_text: str = "2026-01-01T00:00:00.000000Z INFO [run] started\n",
    seed: int = 5,
) -> Path:
    """Write ``<output_root>/<name>``: ``rows`` x ``n`` terminal items, finished."""
    rng = random.Random(seed)
    run = output_root / name
    trials = run / "rollout_trials"
    trials.mkdir(parents=True)
    local_run_id = hashlib.md5(name.encode()).hexdigest()
    manifest = {
        "schema_version": 1,
        "local_run_id": local_run_id,
        "run_name": name,
        "created_at": "2026-01-01T00:00:00.000000Z",
        "inputs": {
            "model_path": "openai/gpt-4o-mini",
            "dataset": {"sha256": "ab" * 32, "selected_source_rows": f"0-{rows - 1}"},
            "n": n,
            "rollout": {"name": "echo", "entrypoint": "main.py", "source_digest": "cd" * 32},
            "versions": {"rollout_protocol": "0.4", "dataset_normalization": 1, "state_schema": 1},
        },
        "provenance": {
            "sdk_version": "0.1.0",
            "git_head": "1" * 40,
            "git_branch": "main",
            "git_dirty": False,
            "config_path": "configs/eval/echo.toml",
            "unknown_key": "never sent",
        },
    }
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    index: list[dict[str, Any]] = []
    for row in range(rows):
        for run_index in range(n):
            rollout_id = _rollout_id(f"{name}/{row}/{run_index}")
            status = ("success", "failed", "skipped")[(row + run_index) % 3]
            trial = trials / rollout_id
            (trial / "artifacts" / "deep" / "er").mkdir(parents=True)
            (trial / "artifacts" / "manifest.json").write_text('{"files": []}\n')
            (trial / "artifacts" / "deep" / "manifest.json").write_text('{"nested": true}\n')
            (trial / "artifacts" / "deep" / "er" / "out.txt").write_text(f"{row}/{run_index}\n")
            (trial / "logs").mkdir()
            (trial / "logs" / "trial.log").write_text("per-trial log\n")
            (trial / "harbor").mkdir()
            (trial / "harbor" / "result.json").write_text("{}\n")
            entry: dict[str, Any] = {"row_index": row, "run_index": run_index}
            entry["rollout_id"] = rollout_id
            entry["status"] = status
            if status != "skipped":
                sample = RolloutSample(
                    [{"role": "user", "content": f"q{row}"}, {"role": "assistant", "content": "a"}],
                    label=str(row),
                    reward=1.0 if status == "success" else None,
                )
                doc = build_trajectory(
                    rollout_id,
                    sample,
                    sdk_version="0.1.0",
                    request_extra_fields={"row_index": row, "run_index": run_index},
                )
                (trial / "trajectory.json").write_text(json.dumps(doc, indent=2))
                entry["trajectory_filename"] = "trajectory.json"
            if status == "success":
                entry["reward"] = 1.0
            index.append(entry)
    first = trials / index[0]["rollout_id"] / "artifacts"
    (first / "big.bin").write_bytes(rng.randbytes(big_artifact))
    os.mkfifo(first / "a.fifo")
    superseded = trials / _rollout_id("superseded")
    (superseded / "artifacts").mkdir(parents=True)
    (superseded / "artifacts" / "old.txt").write_text("an earlier attempt\n")
    (run / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in index))
    (run / "events.jsonl").write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in index))
    progress = {"total_runs": rows * n, "sampled_rows": rows, "total_dataset_rows": rows + 2}
    (run / "progress.json").write_text(json.dumps(progress) + "\n")
    metrics = {
        "eval_run": {
            "id": local_run_id,
            "status": "finished",
            "name": name,
            "dataset_name": "data/echo.jsonl",
            "model_name": "openai/gpt-4o-mini",
            "rollout_name": "echo",
            "duration_ms": 1234.5,
            "started_at": "2026-01-01T00:00:00.000000Z",
            "completed_at": "2026-01-01T00:00:01.234500Z",
        },
        "summary": {"pass_threshold": 1, "total_samples": rows * n},
    }
    (run / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (run / "summary.jsonl").write_text("{}\n")
    (run / "dataset_rows.jsonl").write_text("".join(f'{{"row_index": {r}}}\n' for r in range(rows)))
    for projection in ("trajectories", "artifacts"):
        (run / projection).mkdir()
        (run / projection / "copy.json").write_text("{}\n")
    (run / "server.json").write_text("{}\n")
    (run / "tunnel.json").write_text("{}\n")
    (run / "logs.txt").write_text(log_text)
    return run


def expected_paths(run: Path) -> list[str]:
    """The upload paths the spec's C.4 selects for a run written by :func:`write_finished_run`."""
    paths = list(SENT)
    for line in (run / "index.jsonl").read_text().splitlines():
        entry = json.loads(line)
        base = f"rollout_trials/{entry['rollout_id']}"
        if "trajectory_filename" in entry:
            paths.append(f"{base}/trajectory.json")
        paths += [f"{base}/artifacts/deep/manifest.json", f"{base}/artifacts/deep/er/out.txt"]
    first = json.loads((run / "index.jsonl").read_text().splitlines()[0])["rollout_id"]
    paths.append(f"rollout_trials/{first}/artifacts/big.bin")
    return sorted(paths)
