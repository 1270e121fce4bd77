"""Placement end to end: the probe refusing a run, and the exec relay under interrupts and kills.

Real podman, real Harbor, the real ``rollbridge eval run`` (docs/harbor.md, "Placement"):

- ``--advertise-url`` to an address no sandbox reaches (a closed port on the host, dialled as
  ``host.containers.internal``): the run stops before any dispatch with one line naming the URL
  and the probe's outcome; ``diagnostics.json`` keeps the evidence; no trial container was ever
  made and no container of the run is left.
- ``configs/eval/offline.toml`` (no network; the exec relay carries the model calls), one run
  dir, three invocations: Ctrl-C while the relay runs (exit 130, items pending, nothing of the
  trials left on the host), then a ``kill -9`` of the whole tree while the relay runs (the
  relay's host end dies with its trial's process group), then the resume: the dead trials'
  containers are reaped and every row finishes once, through the relay, with the workflow's
  streamed ``openai`` call counted by the bridge.

Processes are matched to this test's trials only (by the rollout server's watchdogs and the
trials' container ids), so other runs on the machine do not disturb the checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from rollout_server.harbor.containers import OWNER_LABEL
from tests.harbor.conftest import LABEL
from tests.launcher.e2e.helpers import (
    count_log,
    journal,
    metrics,
    processes_in_group,
    run_cli,
    run_dir,
    server_record,
    start_cli,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("no_containers_left")

_OUR_PID_NS = os.readlink("/proc/self/ns/pid")
ROWS = "0-1"


def _closed_port() -> int:
    """A port nothing listens on, on any address of this machine (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def _containers_of(server_pid: int, label: str = OWNER_LABEL) -> list[dict[str, str]]:
    """Containers (running or not) carrying ``label`` whose owner is rollout server ``server_pid``."""
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={label}", "--format", "json"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    found = []
    for row in json.loads(listed.stdout or b"[]"):
        labels = row.get("Labels") or {}
        if labels.get(OWNER_LABEL, "").partition(":")[0] == str(server_pid):
            found.append({"id": row["Id"], "name": row["Names"][0], "trial": labels.get(LABEL, "")})
    return found


@dataclass(frozen=True)
class Proc:
    pid: int
    created: float
    pgid: int
    cmdline: tuple[str, ...]


def _host_processes() -> list[Proc]:
    """Live processes of this machine's own pid namespace (a container's are not listed)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "create_time"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or not proc.info["cmdline"]:
                continue
            if os.readlink(f"/proc/{proc.pid}/ns/pid") != _OUR_PID_NS:
                continue
            pgid = os.getpgid(proc.pid)
        except (OSError, psutil.Error):
            continue
        found.append(Proc(proc.pid, proc.info["create_time"], pgid, tuple(proc.info["cmdline"])))
    return found


def _alive(proc: Proc) -> bool:
    try:
        current = psutil.Process(proc.pid)
        return current.create_time() == proc.created and current.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_relay(proc: Proc) -> bool:
    """The host end of an exec relay: ``podman exec -i <ctr> python3 -u -c <relay source> ...``
    (the source is ``rollbridge_relay.py``'s own text), or the relay CLI."""
    return "rollbridge_relay" in " ".join(proc.cmdline)


def _watchdogs(server_pid: int, processes: list[Proc]) -> set[int]:
    """Pids of the trial watchdogs rollout server ``server_pid`` started (each leads a group)."""
    found = set()
    for proc in processes:
        at = [i for i, arg in enumerate(proc.cmdline) if arg.endswith("harbor/_watchdog.py")]
        if at and proc.cmdline[at[0] + 1 : at[0] + 2] == (str(server_pid),):
            found.add(proc.pid)
    return found


@dataclass
class Watch:
    """What one CLI invocation's rollout server ran, polled while it runs."""

    run: Path
    not_server: int | None = None
    server: dict[str, Any] | None = None
    groups: set[int] = field(default_factory=set)
    relays: dict[int, Proc] = field(default_factory=dict)
    relay_groups: dict[int, int] = field(default_factory=dict)
    containers: dict[str, dict[str, str]] = field(default_factory=dict)

    def poll(self) -> None:
        if self.server is None:
            record = server_record(self.run)
            if record is None or record["pid"] == self.not_server:
                return
            self.server = record
        pid = self.server["pid"]
        processes = _host_processes()
        watchdogs = _watchdogs(pid, processes)
        self.groups |= watchdogs
        for proc in processes:
            if proc.pid in self.relays or not _is_relay(proc):
                continue
            with_parents = {proc.pid}
            try:
                with_parents |= {p.pid for p in psutil.Process(proc.pid).parents()}
            except psutil.Error:
                continue
            if with_parents & watchdogs:
                self.relays[proc.pid] = proc
                self.relay_groups[proc.pid] = proc.pgid
        for container in _containers_of(pid, LABEL):
            self.containers[container["id"]] = container

    @property
    def server_pid(self) -> int:
        assert self.server is not None
        return int(self.server["pid"])

    def markers(self) -> set[str]:
        """Strings only this run's trials put in a command line: trial names, container ids."""
        found = set()
        for container in self.containers.values():
            found |= {container["id"][:12], container["name"]}
            if container["trial"]:
                found.add(container["trial"])
        return found

    def leftovers(self) -> list[Proc]:
        """Host processes still working for this run's trials (relays, execs, Harbor, conmon)."""
        markers = self.markers()
        mine = set(self.relays)
        return [
            proc
            for proc in _host_processes()
            if (proc.pid in mine and _alive(self.relays[proc.pid]))
            or proc.pgid in self.groups
            or any(marker in arg for arg in proc.cmdline for marker in markers)
        ]


def _inside_relays(container_ids: list[str]) -> int:
    """How many relay inside ends still run in these containers (for the log only)."""
    count = 0
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "rollbridge_relay" not in " ".join(proc.info["cmdline"] or []):
                continue
            cgroup = Path(f"/proc/{proc.pid}/cgroup").read_text()
        except (OSError, psutil.Error):
            continue
        count += any(cid in cgroup for cid in container_ids)
    return count


def _describe(procs: list[Proc]) -> list[str]:
    return [f"{p.pid}: {' '.join(p.cmdline)[:160]}" for p in procs]


async def _until_relay(live: Any, watch: Watch, timeout: float) -> None:
    """Poll until a trial's relay runs (its agent phase); then check what the watch sees."""

    def seen() -> bool:
        watch.poll()
        return bool(watch.relays) or live.process.returncode is not None

    await wait_for(seen, timeout=timeout, interval=0.5)
    assert watch.relays, (await live.wait(timeout=60)).stdout
    for pid, pgid in watch.relay_groups.items():
        assert pgid in watch.groups, (pid, pgid, watch.groups)  # the relay is in its trial's group
    # The leftover scan sees this run's live trial processes (so its empty answer later counts).
    live_ones = watch.leftovers()
    assert set(watch.relays) <= {p.pid for p in live_ones}
    assert any(p.pgid in watch.groups and p.pid not in watch.relays for p in live_ones)


# -- 1. an --advertise-url no sandbox reaches ---------------------------------------------------


@pytest.mark.timeout(600)
async def test_unreachable_advertise_url_stops_the_run_before_any_dispatch(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    url = f"http://host.containers.internal:{_closed_port()}"
    args = ["eval", "run", "ws/configs/eval/workflow.toml", "--yes", "--name", "adv"]
    # The bridge listens on a fixed port of its own (--advertise-url needs one); the URL names
    # another, closed, port.
    listener = _closed_port()
    args += ["--rows", "0", "--advertise-url", url, "--listener-port", str(listener)]
    run = run_dir(harbor_workspace, "adv")
    live = await start_cli(args, cwd=tmp_path, env=harbor_env, logdir=tmp_path / "out")
    watch = Watch(run)

    def finished() -> bool:
        watch.poll()
        return live.process.returncode is not None

    await wait_for(finished, timeout=500, interval=0.5)
    result = await live.wait(timeout=30)
    output = result.stdout + result.stderr
    assert result.returncode not in (0, 130), output
    assert "Traceback" not in output
    # One error line names the URL and the probe's outcome (the other line naming the URL is
    # the progress step announcing it).
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    (line,) = errors
    others = [x for x in output.splitlines() if url in x and x != line]
    assert all("advertising chat endpoint through" in x for x in others), output
    assert line.startswith(f"Error: --advertise-url {url} is not reachable from the sandbox: ")
    outcome = line.split("sandbox: ", 1)[1].split(" ", 1)[0]
    assert outcome in ("refused", "timeout"), line
    # Nothing was dispatched: no rollout, no journal record, no trial container ever made.
    assert watch.server is not None, "the rollout server never started"
    assert count_log(run, "dispatching rollout") == 0
    assert journal(run) == []
    trials = run / "rollout_trials"
    assert not trials.exists() or not any(trials.iterdir())
    assert watch.containers == {}
    # The evidence of the probe, for later reading.
    diagnostics = json.loads((run / "diagnostics.json").read_text())["sandbox_probe"]
    assert diagnostics["route"] is None
    (round_,) = diagnostics["rounds"]
    assert round_["exclusive"] is True
    assert {"kind": "advertise", "url": url} in round_["candidates"]
    (attempt,) = round_["report"]["evidence"]
    assert (attempt["kind"], attempt["url"], attempt["outcome"]) == ("advertise", url, outcome)
    assert count_log(run, f"sandbox probe: advertise {url} {outcome}") == 1
    assert _containers_of(watch.server_pid) == []
    print(f"exit {result.returncode}; {outcome} in {attempt['elapsed_ms']:.0f} ms; {line}")


# -- 2 and 3. offline: Ctrl-C and kill -9 while the relay runs, then the resume ---------------------


def _prompts(workspace: Path) -> dict[int, str]:
    rows = (workspace / "data" / "hello.jsonl").read_text().splitlines()
    return {i: json.loads(row)["user_prompt"] for i, row in enumerate(rows)}


def _container_result(run: Path, rollout_id: str) -> dict[str, Any]:
    path = run / "rollout_trials" / rollout_id / "harbor" / "agent" / "container_result.json"
    document: dict[str, Any] = json.loads(path.read_text())
    return document


@pytest.mark.timeout(900)
async def test_offline_relay_survives_nothing_of_ctrl_c_or_kill_9_and_the_resume_streams(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", "ws/configs/eval/offline.toml", "--yes", "--name", "off"]
    args += ["--rows", ROWS]
    run = run_dir(harbor_workspace, "off")

    # Ctrl-C while the trials' agent phase runs (its relay is up).
    live = await start_cli(args, cwd=tmp_path, env=harbor_env, logdir=tmp_path / "cc")
    first = Watch(run)
    await _until_relay(live, first, timeout=400)
    live.signal(signal.SIGINT)
    result = await live.wait(timeout=300)
    assert result.returncode == 130, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "interrupted: cancelling in-flight rollouts" in result.stdout
    assert count_log(run, "rollout cancelled") == 2
    assert journal(run) == []
    assert metrics(run)["eval_run"]["status"] == "incomplete"
    assert _containers_of(first.server_pid) == []
    assert not processes_in_group(int(first.server["pgid"]))  # type: ignore[index]
    assert first.containers, "no trial container was seen"
    assert _describe(first.leftovers()) == []

    # kill -9 of the whole tree while the relay runs: supervisor, rollout server, trials.
    live = await start_cli(args, cwd=tmp_path, env=harbor_env, logdir=tmp_path / "k9")
    second = Watch(run, not_server=first.server_pid)
    await _until_relay(live, second, timeout=400)
    groups = [int(second.server["pgid"]), *second.groups]  # type: ignore[index]
    live.kill9()
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    await live.wait(timeout=30)
    for pgid in groups:
        await wait_for(lambda pgid=pgid: not processes_in_group(pgid), timeout=30)
    # The relays' host ends were in their trials' groups: none outlives the kill.
    await wait_for(lambda: not any(_alive(p) for p in second.relays.values()), timeout=30)
    assert not [p for p in _host_processes() if _is_relay(p) and p.pgid in second.groups]
    survivors = _containers_of(second.server_pid, LABEL)
    assert survivors, "the containers should outlive their killed owners"
    ends = _inside_relays([c["id"] for c in survivors])
    print(f"after kill -9: {len(survivors)} container(s) left, {ends} relay inside end(s) in them")

    # The resume reaps them and finishes every row once, through the relay.
    again = await run_cli(args, cwd=tmp_path, env=harbor_env, timeout=500)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output
    assert "sandboxes reach the bridge through relay" in again.stdout
    reaped = [
        line for line in (run / "logs.txt").read_text().splitlines() if "harbor: reaped" in line
    ]
    assert reaped, output
    for container in survivors:
        assert any(container["trial"] in line for line in reaped), (container, reaped)
    assert _containers_of(second.server_pid) == []
    assert _describe(second.leftovers()) == []
    records = journal(run)
    keys = [(r["row_index"], r["run_index"]) for r in records]
    assert sorted(keys) == [(0, 0), (1, 0)], keys
    assert sorted((r["status"], r.get("reward")) for r in records) == [("success", 1.0)] * 2
    prompts = _prompts(harbor_workspace)
    index = [json.loads(line) for line in (run / "index.jsonl").read_text().splitlines()]
    assert sorted(row["row_index"] for row in index) == [0, 1]
    for row in index:
        assert row["status"] == "success" and row["reward"] == 1.0, row
        inside = _container_result(run, row["rollout_id"])
        assert inside["status"] == "success"
        metrics_ = inside["metrics"]
        assert metrics_["clients_agree"] == 1.0, metrics_
        # The echo model streams one chunk per word; each arrived as its own delta.
        words = len(prompts[row["row_index"]].split())
        assert metrics_["streamed_chunks"] == words > 1, metrics_
        # Both calls (the SDK's chat and the streamed one) counted, with the same usage.
        assert row["tokens"] > 0 and row["tokens"] == 2 * row["max_context_tokens"], row
        print(f"row {row['row_index']}: metrics {metrics_}, tokens {row['tokens']}")
    print(f"reaped: {reaped}; first relays {len(first.relays)}, second {len(second.relays)}")
