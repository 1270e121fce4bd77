"""The reference (``osmosis eval run`` of osmosis-ai 0.3.8) run end to end, for side-by-side benchmarks.

``run_reference_eval(upstream_v1, rows, in_flight, work=...)`` runs the reference CLI on an echo
rollout of ``rows`` rows with ``in_flight`` rollouts at once, against an OpenAI-compatible
upstream (the test suite's fake), and returns a :class:`ReferenceRun`: wall time from spawn to
exit, exit code, the outcome counts read from the reference's own run directory, and the CPU of
the CLI's whole process tree (the CLI with its in-process bridge, uv, the rollout server). A
run that did not succeed on every row with reward 1.0 (or, when a request counter is given,
that sent fewer chat calls upstream than rows) raises :class:`ReferenceRunFailed`.

The reference is installed once, with the workspace its CLI insists on, by
``reference_setup.ensure_reference`` (cached under ``~/.cache/rollbridge/bench-reference/``;
see that module). The rollout (``scripts/bench/reference_rollout``) is an echo rollout written
with the reference's own SDK doing the work of ``examples/workspace/rollouts/echo``: one chat
call through the reference's model bridge with the row's messages, reward 1.0 when the label is
in the reply, on a ``LocalBackend`` without a concurrency limit (our benchmark runs ours
unbounded too). The CLI runs with ``--dataset-file`` (so no platform credentials are needed),
``--yes``, ``--json``, a fresh ``--name`` and ``--max-in-flight``, with the model
``openai/fake-model`` routed by LiteLLM to ``OPENAI_BASE_URL`` = the upstream,
``LITELLM_LOCAL_MODEL_COST_MAP=True``, ``HARBOR_TELEMETRY=0`` and ``UV_OFFLINE=1``.

Each call writes ``data/bench-<rows>.jsonl`` (the rows of ``scripts/bench/bench_eval.py``) and
``configs/eval/bench-<in_flight>.toml`` into the workspace (same content for the same
arguments, written atomically) and puts the run directories under ``work`` (``-o``), so the
cache stays small. By default a 200-row warm-up run precedes the measured one, as in our
benchmark, so the uv and bytecode caches and the OS page cache are warm.

Run alone: ``.venv/bin/python scripts/bench/reference_eval.py [--rows 1000] [--in-flight 50]``
starts the fake upstream in this process and prints the reference's wall and rows/s.

Why one module of this size: the reference's invocation, its process-tree CPU sampling and the
reading of its run directory must agree on one spawn and one workspace layout; split, each part
would pass the others the same half-dozen paths and the process handle.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import psutil
import trio

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _path in (str(REPO), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from reference_setup import (  # noqa: E402
    REFERENCE_VERSION,
    ReferenceSetup,
    ReferenceUnavailable,
    ensure_reference,
    uv_env,
)

if TYPE_CHECKING:
    from tests.fakes.upstream import FakeUpstream

WARM_UP_ROWS = 200

EVAL_CONFIG = """\
[experiment]
rollout = "echo"
entrypoint = "main.py"
model_path = "openai/fake-model"
dataset = "bench"

[evaluation]
n = 1
batch_size = {in_flight}
agent_workflow_timeout_s = 600
grader_timeout_s = 60

[secrets]
required = []
"""


class ReferenceRunFailed(RuntimeError):
    """The reference ran but did not do every row (or exited non-zero)."""


@dataclass(frozen=True)
class ReferenceRun:
    """One run of the reference CLI."""

    name: str
    rows: int
    in_flight: int
    wall_s: float
    """Spawn of the reference CLI -> its exit."""
    start_to_first_dispatch_s: float | None
    dispatch_wall_s: float | None
    """First ``dispatching rollout`` -> last ``work item finished`` in the run's logs.txt."""
    last_result_to_exit_s: float | None
    exit_code: int
    succeeded: int
    failed: int
    skipped: int
    rewarded: int
    """Successes with reward 1.0."""
    cpu_s: float
    """User + system CPU of the CLI's process tree (50 ms samples, last value seen per pid)."""
    cli_cpu_s: float
    """The part of ``cpu_s`` spent in the CLI's own process (supervisor and its bridge)."""
    upstream_calls: int | None
    """Chat calls the upstream received during the run, preflight included (None without a
    counter)."""
    run_dir: Path
    timed_out: bool = False
    """The run was stopped at its ``timeout_s`` (its counts are what it journaled by then)."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s

    @property
    def cpu_ms_per_row(self) -> float:
        return self.cpu_s / self.rows * 1000


def _write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_inputs(workspace: Path, rows: int, in_flight: int) -> tuple[str, str]:
    """The dataset and the config for one run; returns (config, dataset) relative to the workspace."""
    lines = []
    for i in range(rows):
        word = f"word{i}"
        lines.append(json.dumps({"user_prompt": f"Repeat after me: {word}", "ground_truth": word}))
    dataset = f"data/bench-{rows}.jsonl"
    config = f"configs/eval/bench-{in_flight}.toml"
    _write_if_changed(workspace / dataset, "\n".join(lines) + "\n")
    _write_if_changed(workspace / config, EVAL_CONFIG.format(in_flight=in_flight))
    return config, dataset


def read_outcomes(run_dir: Path) -> dict[str, int]:
    """Counts by status (and successes with reward 1.0) from the run's ``index.jsonl``."""
    counts = {"success": 0, "failed": 0, "skipped": 0, "rewarded": 0}
    index = run_dir / "index.jsonl"
    if not index.exists():
        return counts
    for line in index.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        status = item.get("status")
        if status in counts:
            counts[status] += 1
        if status == "success" and item.get("reward") == 1.0:
            counts["rewarded"] += 1
    return counts


def _log_time(line: str) -> float:
    stamp = line.split(" ", 1)[0]
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def dispatch_span(run_dir: Path) -> tuple[float | None, float | None]:
    """Wall-clock times of the first dispatch and the last result in the run's ``logs.txt``."""
    first = last = None
    logs = run_dir / "logs.txt"
    if not logs.exists():
        return None, None
    with open(logs, errors="replace") as fh:
        for line in fh:
            if first is None and "[dispatch] dispatching rollout" in line:
                first = _log_time(line)
            elif "[result] work item finished" in line:
                last = _log_time(line)
    return first, last


def _tree_cpu(root: psutil.Process, seen: dict[int, float]) -> None:
    """Record the CPU of ``root`` and its descendants into ``seen`` (by pid, last value)."""
    with contextlib.suppress(psutil.Error):
        times = root.cpu_times()
        seen[root.pid] = times.user + times.system
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child_times = child.cpu_times()
                seen[child.pid] = child_times.user + child_times.system


async def _stop_tree(proc: trio.Process, root: psutil.Process) -> None:
    """Stop an unfinished run (the caller was cancelled): SIGTERM, which the reference CLI
    answers by stopping its rollout server (in a session of its own), then SIGKILL for whatever
    of the tree is left after a grace period."""
    tree = [root]
    with contextlib.suppress(psutil.Error):
        tree += root.children(recursive=True)
    proc.terminate()
    with trio.move_on_after(15):
        await proc.wait()
    for process in tree:
        with contextlib.suppress(psutil.Error):
            process.kill()
    await proc.wait()


def _open_output(path: Path) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")  # the caller closes it


_names = 0


def _fresh_name(rows: int, label: str) -> str:
    global _names
    _names += 1
    return f"ref-{label}-{rows}-{os.getpid()}-{time.time_ns() // 1_000_000}-{_names}"


async def _run_once(
    setup: ReferenceSetup,
    upstream_v1: str,
    rows: int,
    in_flight: int,
    work: Path,
    label: str,
    count_upstream_calls: Callable[[], int] | None,
    timeout_s: float | None = None,
    check: bool = True,
) -> ReferenceRun:
    config, dataset = await trio.to_thread.run_sync(write_inputs, setup.workspace, rows, in_flight)
    name = _fresh_name(rows, label)
    env = {
        k: v
        for k, v in uv_env(str(setup.python312), offline=True).items()
        if not k.endswith("_API_KEY")
    }
    env.update(
        OPENAI_BASE_URL=upstream_v1,
        OPENAI_API_KEY="sk-bench-key",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        HARBOR_TELEMETRY="0",
    )
    argv = [
        str(setup.python),
        "-m",
        "osmosis_ai.cli.main",
        "--json",
        "eval",
        "run",
        config,
        "--dataset-file",
        dataset,
        "--name",
        name,
        "-o",
        str(work),
        "--yes",
        "--max-in-flight",
        str(in_flight),
    ]
    out_path = work / f"{name}.out"
    output = await trio.to_thread.run_sync(_open_output, out_path)
    calls_before = count_upstream_calls() if count_upstream_calls is not None else 0
    seen: dict[int, float] = {}
    with output as out:
        started = time.time()
        proc = await trio.lowlevel.open_process(
            argv, cwd=str(setup.workspace), env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            root = psutil.Process(proc.pid)
            exited = 0.0

            async def wait_exit(cancel: trio.CancelScope) -> None:
                nonlocal exited
                await proc.wait()
                exited = time.time()
                cancel.cancel()

            with trio.move_on_after(math.inf if timeout_s is None else timeout_s) as limit:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(wait_exit, nursery.cancel_scope)
                    while True:
                        _tree_cpu(root, seen)
                        await trio.sleep(0.05)
            if limit.cancelled_caught:
                exited = time.time()
        finally:
            if proc.returncode is None:
                with trio.CancelScope(shield=True):
                    await _stop_tree(proc, root)
    assert proc.returncode is not None
    calls = count_upstream_calls() - calls_before if count_upstream_calls is not None else None
    run_dir = work / name
    counts = await trio.to_thread.run_sync(read_outcomes, run_dir)
    first, last = await trio.to_thread.run_sync(dispatch_span, run_dir)
    run = ReferenceRun(
        name=name,
        rows=rows,
        in_flight=in_flight,
        wall_s=exited - started,
        start_to_first_dispatch_s=first - started if first else None,
        dispatch_wall_s=last - first if first and last else None,
        last_result_to_exit_s=exited - last if last else None,
        exit_code=proc.returncode,
        succeeded=counts["success"],
        failed=counts["failed"],
        skipped=counts["skipped"],
        rewarded=counts["rewarded"],
        cpu_s=sum(seen.values()),
        cli_cpu_s=seen.get(proc.pid, 0.0),
        upstream_calls=calls,
        run_dir=run_dir,
        timed_out=limit.cancelled_caught,
    )
    if check:
        await trio.to_thread.run_sync(verify_run, run, out_path)
    return run


def verify_run(run: ReferenceRun, out_path: Path) -> None:
    """Raise :class:`ReferenceRunFailed` unless ``run`` did every row (``out_path``: its output)."""
    problems = []
    if run.exit_code != 0:
        problems.append(f"exited {run.exit_code}")
    if run.rewarded != run.rows:
        problems.append(
            f"{run.rewarded} of {run.rows} rows succeeded with reward 1.0 "
            f"({run.succeeded} success, {run.failed} failed, {run.skipped} skipped)"
        )
    if run.upstream_calls is not None and run.upstream_calls < run.rows:
        problems.append(f"the upstream saw {run.upstream_calls} chat calls for {run.rows} rows")
    if problems:
        tail = out_path.read_text(errors="replace").strip().splitlines()[-3:]
        raise ReferenceRunFailed(
            f"reference run {run.name}: {'; '.join(problems)} "
            f"(output {out_path}: {' | '.join(tail)}; logs {run.run_dir / 'logs.txt'})"
        )


async def run_reference_eval(
    upstream_v1: str,
    rows: int,
    in_flight: int,
    *,
    work: Path,
    count_upstream_calls: Callable[[], int] | None = None,
    warm_up: bool = True,
    timeout_s: float | None = None,
    check: bool = True,
) -> ReferenceRun:
    """Run ``osmosis eval run`` (osmosis-ai 0.3.8) on ``rows`` echo rows, ``in_flight`` at once.

    ``upstream_v1`` is the model's OpenAI-style base URL (``FakeUpstream.v1``); ``work`` holds
    the run directories and the CLI's output; ``count_upstream_calls`` (the chat calls the
    upstream has received so far, e.g. ``lambda: len(upstream.requests)``) lets the run be
    checked against the upstream's own count. With ``warm_up`` a 200-row run precedes the measured one. Builds the cached
    reference first if needed (:func:`ensure_reference`; raises :class:`ReferenceUnavailable`
    when it cannot); raises :class:`ReferenceRunFailed` unless every row succeeded with
    reward 1.0 (with ``check``; without it the run is returned as it ended). ``timeout_s``
    stops the measured run (its whole process tree) after that long: ``timed_out`` says so.
    """
    setup = await trio.to_thread.run_sync(ensure_reference)
    work = await trio.to_thread.run_sync(work.resolve)
    if warm_up:
        await _run_once(
            setup, upstream_v1, WARM_UP_ROWS, in_flight, work, "warmup", count_upstream_calls
        )
    return await _run_once(
        setup,
        upstream_v1,
        rows,
        in_flight,
        work,
        "run",
        count_upstream_calls,
        timeout_s=timeout_s,
        check=check,
    )


def _secs(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def _chat_requests(upstream: FakeUpstream) -> int:
    """Chat calls the fake upstream received (its ``completed`` counter stays at 0 on hypercorn,
    which reports a disconnect to the app after each answer)."""
    return sum(1 for r in upstream.requests if r.path.endswith("/chat/completions"))


async def _main(rows: int, in_flight: int, work: Path, warm_up: bool) -> None:
    from tests.fakes.upstream import run_fake_upstream

    setup = await trio.to_thread.run_sync(ensure_reference)
    if setup.build_s:
        print(f"built the cached reference in {setup.build_s:.1f} s")
    async with trio.open_nursery() as nursery:
        # A deep listen backlog, as bench_eval.py gives its upstream: a real provider does not
        # drop SYNs.
        upstream: FakeUpstream = await nursery.start(
            lambda task_status: run_fake_upstream(backlog=4096, task_status=task_status)
        )
        failure: ReferenceUnavailable | ReferenceRunFailed | None = None
        try:
            run = await run_reference_eval(
                upstream.v1,
                rows,
                in_flight,
                work=work,
                count_upstream_calls=lambda: _chat_requests(upstream),
                warm_up=warm_up,
            )
        except (ReferenceUnavailable, ReferenceRunFailed) as exc:
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        # Raised outside the nursery, so that it is not wrapped in an exception group.
        raise failure
    print(
        f"reference osmosis-ai {REFERENCE_VERSION}: {rows} rows, {in_flight} in flight: "
        f"wall {run.wall_s:.2f} s, {run.rows_per_s:.1f} rows/s, CPU {run.cpu_s:.1f} s "
        f"({run.cpu_ms_per_row:.1f} ms/row, process tree; CLI process {run.cli_cpu_s:.1f} s), "
        f"{run.rewarded}/{rows} rewarded, "
        f"start -> first dispatch {_secs(run.start_to_first_dispatch_s)}, dispatch "
        f"{_secs(run.dispatch_wall_s)}, last result -> exit {_secs(run.last_result_to_exit_s)}, "
        f"{run.upstream_calls} upstream calls; run dir {run.run_dir}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=50, dest="in_flight")
    parser.add_argument("--work", type=Path, default=REPO / ".bench" / "reference")
    parser.add_argument("--no-warm-up", action="store_false", dest="warm_up")
    args = parser.parse_args()
    if args.rows < 1 or args.in_flight < 1:
        parser.error("--rows and --in-flight must be positive")
    print(f"load average at start: {os.getloadavg()}")
    try:
        trio.run(_main, args.rows, args.in_flight, args.work, args.warm_up)
    except (ReferenceUnavailable, ReferenceRunFailed) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"load average at end: {os.getloadavg()}")
