"""Benchmark the Harbor backend on the real test bed (run scripts/sandbox-testbed first).

1. Per-trial overhead: one oracle trial of examples/harbor/tasks/hello through
   ``HarborBackend.execute`` against the same trial run by hand with ``harbor trial start``
   (same overlay, same trials root). Prints both walls and the ratio.
2. Wall for N oracle rows (default 8) at concurrency 1, 2 and 4, with the speed-up over 1.

Usage: python scripts/bench/bench_harbor.py [--rows 8] [--repeat 1] [--concurrency 1,2,4]
Only this machine is involved: podman's registries are blocked, Harbor telemetry is off.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import trio

from rollout_server.backend import ExecutionRequest
from rollout_server.harbor import HarborBackend, find_harbor
from rollout_server.harbor.containers import OWNER_LABEL, TRIAL_LABEL, owner_token
from rollout_server.sdk import RolloutContext, set_rollout_context

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "examples" / "harbor" / "tasks" / "hello"
PROMPT = [{"role": "user", "content": "Create the file /app/answer.txt containing hello."}]
os.environ.update(HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True")


def by_hand(root: Path) -> float:
    """Wall of one ``harbor trial start`` of the task with the backend's overlay."""
    harbor = find_harbor()
    name = f"trial-hand-{uuid.uuid4().hex[:8]}"
    overlay = root / "overlay.json"
    labels = {TRIAL_LABEL: name, OWNER_LABEL: owner_token()}
    overlay.write_text(json.dumps({"services": {"main": {"init": True, "labels": labels}}}))
    env = dict(os.environ, PATH=f"{Path(harbor[0]).parent}{os.pathsep}{os.environ['PATH']}")
    argv = [*harbor, "trial", "start", "-p", str(TASK), "-a", "oracle", "-e", "podman"]
    argv += ["--trials-dir", str(root / "hand"), "--trial-name", name]
    argv += ["--extra-docker-compose", str(overlay)]
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=600)
    wall = time.perf_counter() - start
    result = json.loads((root / "hand" / name / "result.json").read_text())
    assert result["verifier_result"]["rewards"]["reward"] == 1.0, result.get("exception_info")
    return wall


async def through_backend(root: Path, rows: int, concurrency: int) -> float:
    """Wall of ``rows`` oracle trials through HarborBackend.execute at ``concurrency``."""
    backend = HarborBackend(
        TASK, agent="oracle", concurrency=concurrency, trials_root=root / "backend"
    )
    rewards: list[float | None] = []

    async def one(index: int) -> None:
        rid = f"bench{index}{uuid.uuid4().hex[:8]}"
        set_rollout_context(RolloutContext("", None, rid))
        request = ExecutionRequest(id=rid, prompt=PROMPT, rollout_dir=root / "out" / rid)
        outcome = await backend.execute(request)
        sample = outcome.reported().sample
        rewards.append(sample.reward if sample is not None else None)

    start = time.perf_counter()
    with trio.fail_after(1800):
        async with trio.open_nursery() as nursery:
            for index in range(rows):
                nursery.start_soon(one, index)
    wall = time.perf_counter() - start
    assert rewards == [1.0] * rows, rewards
    return wall


def main() -> None:
    """Run both measurements and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--concurrency", default="1,2,4")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-harbor-"))
    try:
        hand = [by_hand(root) for _ in range(args.repeat)]
        backend = [trio.run(through_backend, root, 1, 1) for _ in range(args.repeat)]
        h, b = min(hand), min(backend)
        print(f"one oracle trial: by hand {h:.1f} s, through HarborBackend {b:.1f} s")
        print(f"  overhead {b - h:+.1f} s per trial, ratio {b / h:.2f}")
        walls: dict[int, float] = {}
        for c in (int(x) for x in args.concurrency.split(",")):
            walls[c] = trio.run(through_backend, root, args.rows, c)
            base = walls[min(walls)]
            print(
                f"{args.rows} oracle rows at concurrency {c}: {walls[c]:.1f} s "
                f"({walls[c] / args.rows:.1f} s/row, speed-up x{base / walls[c]:.2f})"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
