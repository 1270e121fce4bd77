"""Issue 29's targets in one invocation: each benchmark that prints one of them, run one after
the other, then every ``target`` line gathered into one table with the load average at the start
and end of each step.

The steps (each a subprocess of this interpreter, its own output passed through as it comes):

1. ``bench_journal.py --replay-only --records 1000000``: replay of a 1,000,000-record journal
   (<= 1 s, supervisor RSS <= 500 MB during the replay);
2. ``bench_eval.py --case 2 --case 3 --reference skip``, twice: the latency-bound case (1000
   rows, 500 ms, 200 in flight, <= 1.15x ideal) and 1000 in flight at 5 s (<= 1.3x ideal "in two
   invocations out of two");
3. ``bench_inflight.py``: 10,000 in flight at 30 s (<= 1.3x ideal, supervisor RSS <= 300 MB,
   0 errors); ``--reference run`` adds osmosis-ai 0.3.8 at the same size (up to
   ``--reference-timeout`` seconds more);
4. ``bench_harbor.py --concurrency 4 --repeat 2``: 8 oracle trials at concurrency 4 against
   Harbor's own CLI (<= 0.5x); skipped, and said so, where the sandbox test bed is absent.

Each step's baseline is measured inside that step (the ideal from a 1-row run, Harbor's CLI,
msgspec's decode floor), so the ratios hold whatever the host's speed that minute; the load
average beside each says how quiet the machine was. Nothing is deleted between steps (deleting
a large tree makes file creation cost more CPU on this VM's disk for minutes:
docs/performance.md).

Run: .venv/bin/python scripts/bench/bench_issue29.py [--skip journal,eval,inflight,harbor]
[--reference run|skip] [--reference-timeout 720] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Step:
    """One benchmark run and what it printed."""

    name: str
    argv: list[str]
    load_start: float = 0.0
    load_end: float = 0.0
    wall_s: float = 0.0
    code: int | None = None
    targets: list[str] = field(default_factory=list)


def run(step: Step) -> None:
    """Run one step, passing its output through and keeping its ``target`` lines."""
    print(f"\n=== {step.name}: {' '.join(step.argv[1:])}", flush=True)
    step.load_start = os.getloadavg()[0]
    began = time.monotonic()
    with subprocess.Popen(
        step.argv,
        cwd=HERE.parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            text = line.strip()
            if text.startswith("target "):
                step.targets.append(text[len("target ") :])
        step.code = proc.wait()
    step.wall_s = time.monotonic() - began
    step.load_end = os.getloadavg()[0]


def harbor_ready() -> str | None:
    """Why the Harbor step cannot run here, or None when the sandbox test bed is ready."""
    if shutil.which("podman") is None:
        return "podman is not installed"
    bed = HERE.parent / "sandbox-testbed"
    if subprocess.run([str(bed), "--check"], capture_output=True).returncode != 0:
        return "the sandbox test bed is not set up (scripts/sandbox-testbed)"
    return None


def table(steps: list[Step]) -> str:
    """The markdown table of every target line, with each step's load average."""
    rows = [
        "| step | load start -> end | wall | target |",
        "|---|---|---|---|",
    ]
    for step in steps:
        load = f"{step.load_start:.2f} -> {step.load_end:.2f}"
        lines = step.targets or [f"(no target line; exit code {step.code})"]
        for text in lines:
            rows.append(f"| {step.name} | {load} | {step.wall_s:.0f} s | {text} |")
    return "\n".join(rows)


def main() -> int:
    """Parse the options, run the steps, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--skip", default="", help="comma-separated steps to leave out")
    parser.add_argument("--reference", choices=("run", "skip"), default="skip")
    parser.add_argument("--reference-timeout", type=float, default=720.0, dest="timeout")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    skip = {s for s in args.skip.split(",") if s}
    py = sys.executable
    steps: list[Step] = []
    if "journal" not in skip:
        steps.append(
            Step(
                "journal replay",
                [py, str(HERE / "bench_journal.py"), "--replay-only", "--records", "1000000"],
            )
        )
    if "eval" not in skip:
        for n in (1, 2):
            argv = [py, str(HERE / "bench_eval.py"), "--case", "2", "--case", "3"]
            steps.append(Step(f"latency-bound #{n}", [*argv, "--reference", "skip"]))
    if "inflight" not in skip:
        argv = [py, str(HERE / "bench_inflight.py"), "--reference", args.reference]
        steps.append(Step("10,000 in flight", [*argv, "--reference-timeout", str(args.timeout)]))
    if "harbor" not in skip:
        why = harbor_ready()
        if why is None:
            argv = [py, str(HERE / "bench_harbor.py"), "--concurrency", "4", "--repeat", "2"]
            steps.append(Step("Harbor c=4", argv))
        else:
            print(f"Harbor step skipped: {why}")
    print(f"bench_issue29: load average at start {os.getloadavg()}; {os.cpu_count()} cores")
    for step in steps:
        run(step)
    out = table(steps)
    print(f"\nbench_issue29: load average at end {os.getloadavg()}\n\n{out}")
    if args.markdown is not None:
        args.markdown.write_text(out + "\n")
    return 0 if all(s.code == 0 for s in steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
