"""Harbor side by side: ``rollbridge eval run`` against Harbor's own ``harbor run`` (issue 29).

The same task directory (``examples/harbor/tasks/hello``), the oracle agent, podman, N trials
(default 8) at each concurrency (default 1, 2 and 4), the two sides interleaved in one
invocation (the order alternates each repetition). Prints, per concurrency, each side's wall
and the CPU time of its process tree (steadier than the wall on a shared machine), the ratio
ours/Harbor's against the target (<= 0.5 at concurrency 4), and a per-trial phase
breakdown (medians) from Harbor's ``result.json`` timestamps, podman's event log and the
backend's own marks (``ROLLBRIDGE_HARBOR_TIMINGS``):

- ``interp``: Harbor's interpreter start (spawn to the trial's ``started_at``; once per job on
  Harbor's side, shown as ``interp(job)``);
- ``image``: the environment's image build (0 when the trial starts from a prebuilt image);
  ``up``: from there until the container runs (compose's ``down``, ``up``);
  ``ready``: until ``exec`` works and the environment is set up;
- ``agent``, ``verifier``: Harbor's phases; ``teardown``: verifier end to the trial's end;
- ``exit``: the trial's end to its process's exit (ours only);
- ``archive``: outcome, scrubbed archive and trial-dir retirement (ours only);
- ``bg-down``: the background teardown after the result was answered (ours, when the backend
  overlaps teardowns; ``ROLLBRIDGE_HARBOR_OVERLAP=0`` turns that off);
- ``pre``: staging and the pre-trial sweep (ours only).

``--variants`` adds rollbridge variants to the same invocation (before/after comparisons): each
is ``name=VAR=value[,VAR=value]`` and sets environment variables for that side's run.

Usage: python scripts/bench/bench_harbor.py [--trials 8] [--concurrency 1,2,4] [--repeat 1]
       [--variants 'before=ROLLBRIDGE_HARBOR_WORKER=0'] [--sides ours,harbor]
Needs the sandbox test bed (``scripts/sandbox-testbed``); only this machine is involved.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "harbor"
HARBOR_VENV = Path.home() / ".cache" / "rollbridge" / "harbor-venv"
UV = Path(sys.executable).parent / "uv"
PROMPT = "Create the file /app/answer.txt containing the single word hello."
PHASES: tuple[str, ...] = ("interp", "pre", "image", "up", "ready", "agent", "verifier")
PHASES += ("teardown", "exit", "archive", "bg-down")
TARGET_RATIO = 0.5


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and k not in ("VIRTUAL_ENV", "OPENAI_BASE_URL")
    }
    env.update(HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@dataclass
class Side:
    """One side's run: its wall and per-trial phases."""

    label: str
    concurrency: int
    wall: float
    rewards: list[float | None]
    trials: list[dict[str, float]] = field(default_factory=list)
    job_interp: float | None = None
    #: CPU time (user + system) of the side's process tree, as far as it waits for its children
    #: (podman's conmon and the containers' own processes are not counted on either side).
    cpu: float | None = None
    #: Ours: CLI start to the first trial's slot, and the last trial's end to the CLI's exit.
    lead_in: float | None = None
    lead_out: float | None = None


def setup(root: Path, trials: int) -> tuple[Path, dict[str, str]]:
    """A copy of the example workspace with ``trials`` rows and a synced rollout environment."""
    ws = root / "ws"
    shutil.copytree(
        EXAMPLE, ws, ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__")
    )
    (ws / "configs" / "training").mkdir(parents=True, exist_ok=True)
    pyproject = ws / "rollouts" / "harbor_hello" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('path = "../../../.."', f'path = "{REPO}"'))
    rows = [{"user_prompt": f"{PROMPT} (row {i})", "ground_truth": "hello"} for i in range(trials)]
    (ws / "data" / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    venv = root / "rollout-venv"
    env = _env(UV_PROJECT_ENVIRONMENT=str(venv))
    subprocess.run(
        [str(UV), "sync", "--project", str(ws / "rollouts" / "harbor_hello")],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return ws, env


def _config(ws: Path, concurrency: int) -> Path:
    path = ws / "configs" / "eval" / f"bench-c{concurrency}.toml"
    path.write_text(
        f"""[experiment]
rollout = "harbor_hello"
entrypoint = "main.py"
model_path = "rollbridge/echo"
dataset = "bench.jsonl"

[evaluation]
n = 1
batch_size = {concurrency}
pass_threshold = 1.0
agent_workflow_timeout_s = 300
grader_timeout_s = 120

[env]
HARBOR_AGENT = "oracle"
HARBOR_CONCURRENCY = "{concurrency}"

[secrets]
required = []
"""
    )
    return path


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def podman_events(since: float, until: float) -> list[dict[str, Any]]:
    """podman's events between two unix times (the test bed logs them to a file)."""
    window = ["--since", str(int(since) - 1), "--until", str(int(until) + 2)]
    done = subprocess.run(
        ["podman", "events", "--stream=false", "--format", "json", *window],
        capture_output=True,
        timeout=120,
        check=False,
    )
    events = []
    for line in done.stdout.decode(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def _phases(
    result: dict[str, Any],
    events: list[dict[str, Any]],
    marks: dict[str, float] | None,
    spawned: float | None,
) -> dict[str, float]:
    """One trial's phase durations (seconds) from its result, podman events and marks."""
    name = str(result.get("trial_name", "")).lower()
    mine = [e for e in events if name and name in str(e.get("Name", "")).lower()]

    def first(kind: str, status: str) -> float | None:
        times = [_ts(e["Time"]) for e in mine if e.get("Type") == kind and e["Status"] == status]
        found = [t for t in times if t is not None]
        return min(found) if found else None

    def span(block: str) -> tuple[float | None, float | None]:
        doc = result.get(block) or {}
        return _ts(doc.get("started_at")), _ts(doc.get("finished_at"))

    started, finished = _ts(result.get("started_at")), _ts(result.get("finished_at"))
    env_start, env_end = span("environment_setup")
    agent_start, _ = span("agent_setup")
    _, agent_end = span("agent_execution")
    ver_start, ver_end = span("verifier")
    built = first("image", "tag") or first("image", "pull")
    running = first("container", "start")
    out: dict[str, float] = {}

    def put(key: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None:
            out[key] = b - a

    if marks is not None:
        put("pre", marks.get("slot"), marks.get("swept"))
        put("interp", marks.get("swept"), started)
        put("exit", finished, marks.get("exited"))
        put("archive", marks.get("exited"), marks.get("retired"))
        put("bg-down", marks.get("down_started"), marks.get("down_done"))
    elif spawned is not None:
        put("interp", spawned, started)
    # No build event: the trial started from a prebuilt image (no image phase of its own).
    put("image", env_start, built or env_start)
    put("up", built or env_start, running)
    put("ready", running, env_end)
    put("agent", agent_start, agent_end)
    put("verifier", ver_start, ver_end)
    put("teardown", ver_end or agent_end, finished)
    return out


def run_ours(
    ws: Path, env: dict[str, str], concurrency: int, tag: str, extra: dict[str, str]
) -> Side:
    """``rollbridge eval run`` of the bench config; phases from the run's archived trials."""
    out = ws.parent / "runs"
    timings = ws.parent / f"timings-{tag}.jsonl"
    timings.unlink(missing_ok=True)
    config = _config(ws, concurrency)
    argv = [sys.executable, "-m", "launcher", "eval", "run", str(config), "--yes", "--plain"]
    argv += ["-o", str(out), "--name", tag]
    child = dict(env, ROLLBRIDGE_HARBOR_TIMINGS=str(timings), **extra)
    start, cpu = time.time(), _children_cpu()
    done = subprocess.run(argv, cwd=ws, env=child, capture_output=True, timeout=3600, check=False)
    wall, cpu = time.time() - start, _children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"rollbridge eval run failed ({tag}):\n{done.stdout.decode()[-3000:]}")
    marks: dict[str, dict[str, float]] = {}
    if timings.exists():
        for line in timings.read_text().splitlines():
            doc = json.loads(line)
            # A trial torn down in the background writes a second, fuller line.
            marks.setdefault(doc["trial"], {}).update(doc["marks"])
    events = podman_events(start, time.time())
    side = Side(tag, concurrency, wall, [], cpu=cpu)
    slots = [m["slot"] for m in marks.values() if "slot" in m]
    ends = [m["done"] for m in marks.values() if "done" in m]
    if slots and ends:
        side.lead_in, side.lead_out = min(slots) - start, start + wall - max(ends)
    for path in sorted(out.glob(f"**/{tag}*/rollout_trials/*/harbor/result.json")):
        result = json.loads(path.read_text())
        side.rewards.append(
            ((result.get("verifier_result") or {}).get("rewards") or {}).get("reward")
        )
        side.trials.append(_phases(result, events, marks.get(result.get("trial_name", "")), None))
    return side


def run_harbor(root: Path, concurrency: int, trials: int, tag: str) -> Side:
    """Harbor's own CLI on the same task directory."""
    jobs = root / "jobs"
    task = root / "ws" / "tasks" / "hello"
    harbor = HARBOR_VENV / "bin" / "harbor"
    argv = [str(harbor), "run", "-p", str(task), "-a", "oracle", "-e", "podman"]
    argv += ["-k", str(trials), "-n", str(concurrency), "-o", str(jobs), "--job-name", tag, "-q"]
    env = _env(PATH=f"{harbor.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    start, cpu = time.time(), _children_cpu()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=3600, check=False)
    wall, cpu = time.time() - start, _children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"harbor run failed ({tag}):\n{done.stdout.decode()[-3000:]}")
    events = podman_events(start, time.time())
    side = Side(tag, concurrency, wall, [], cpu=cpu)
    results = [json.loads(p.read_text()) for p in sorted((jobs / tag).glob("*/result.json"))]
    starts = [s for s in (_ts(r.get("started_at")) for r in results) if s is not None]
    side.job_interp = min(starts) - start if starts else None
    for result in results:
        side.rewards.append(
            ((result.get("verifier_result") or {}).get("rewards") or {}).get("reward")
        )
        side.trials.append(_phases(result, events, None, None))
    return side


def _median(side: Side, phase: str) -> str:
    values = [t[phase] for t in side.trials if phase in t]
    return f"{statistics.median(values):6.2f}" if values else "     -"


def report(sides: list[Side], trials: int) -> None:
    """Walls, ratios and the phase table."""
    print(
        f"\n{trials} oracle trials of tasks/hello on podman; load average {os.getloadavg()[0]:.1f}"
    )
    by_c: dict[int, list[Side]] = {}
    for side in sides:
        by_c.setdefault(side.concurrency, []).append(side)
    for c, group in sorted(by_c.items()):
        harbor = [s for s in group if s.label.startswith("harbor")]
        base = min(s.wall for s in harbor) if harbor else None
        for side in group:
            ok = sum(1 for r in side.rewards if r == 1.0)
            line = f"c={c} {side.label:<22} wall {side.wall:6.1f} s  cpu {side.cpu or 0:5.1f} s"
            line += f"  reward 1.0: {ok}/{trials}"
            if base is not None and not side.label.startswith("harbor"):
                ratio = side.wall / base
                verdict = ""
                if c == 4:
                    verdict = " met" if ratio <= TARGET_RATIO else " not met"
                    verdict = f" (target <= {TARGET_RATIO}:{verdict})"
                line += f"  ratio {ratio:.2f}x Harbor{verdict}"
            if side.job_interp is not None:
                line += f"  interp(job) {side.job_interp:.1f} s"
            if side.lead_in is not None and side.lead_out is not None:
                line += f"  start->first trial {side.lead_in:.1f} s, last trial->exit"
                line += f" {side.lead_out:.1f} s"
            print(line)
    four = by_c.get(4, [])
    harbor4 = [s.wall for s in four if s.label.startswith("harbor")]
    ours4 = [s.wall for s in four if s.label.startswith("ours")]
    if harbor4 and ours4:
        ratio = min(ours4) / min(harbor4)
        verdict = "met" if ratio <= TARGET_RATIO else "not met"
        print(
            f"target {trials} trials at concurrency 4 <= {TARGET_RATIO}x Harbor's own CLI: "
            f"measured {ratio:.2f}x (ours {min(ours4):.1f} s, Harbor {min(harbor4):.1f} s) {verdict}"
        )
    print("\nper-trial phase medians (s):")
    print(f"{'run':<26}" + "".join(f"{p:>9}" for p in PHASES))
    for side in sides:
        row = f"{side.label + ' c=' + str(side.concurrency):<26}"
        print(row + "".join(f"{_median(side, p):>9}" for p in PHASES))


def main() -> None:
    """Parse the options, run the sides interleaved, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--sides", default="ours,harbor")
    parser.add_argument("--variants", action="append", default=[], metavar="NAME=VAR=V[,VAR=V]")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    variants: list[tuple[str, dict[str, str]]] = []
    wanted = args.sides.split(",")
    if "ours" in wanted:
        variants.append(("ours", {}))
    for spec in args.variants:
        name, _, assignments = spec.partition("=")
        extra = dict(a.split("=", 1) for a in assignments.split(",") if a)
        variants.append((name, extra))
    root = Path(tempfile.mkdtemp(prefix="bench-harbor-"))
    sides: list[Side] = []
    try:
        ws, env = setup(root, args.trials)
        for c in (int(x) for x in args.concurrency.split(",")):
            for rep in range(args.repeat):
                order: list[tuple[str, dict[str, str] | None]] = [(n, e) for n, e in variants]
                if "harbor" in wanted:
                    order.append(("harbor", None))
                if rep % 2:
                    order.reverse()
                for name, extra_env in order:
                    tag = f"{name}-c{c}-r{rep}"
                    side = (
                        run_harbor(root, c, args.trials, tag)
                        if extra_env is None
                        else run_ours(ws, env, c, tag, extra_env)
                    )
                    print(f"{tag}: {side.wall:.1f} s", flush=True)
                    sides.append(side)
        report(sides, args.trials)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
