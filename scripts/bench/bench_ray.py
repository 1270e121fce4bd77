"""Dispatch across a two-node Ray cluster against a one-machine run of the same work.

Run (root: it starts ``scripts/ray-testbed``): ``.venv/bin/python scripts/bench/bench_ray.py``
(about 6 minutes on 2 cores; it waits for the test bed's lock, as ``tests/cluster`` do). Each
case runs the same invocation on this machine alone and with ``--ray`` on the test bed (the head
on this machine, node 2 in a network namespace: both on the same 2 cores, so this measures the
overhead of the replica path, not a speed-up), through ``bench_eval.run_eval`` (the real CLI,
the fake provider ``tests/fakes/lean_upstream.py``, the unbounded echo rollout):

1. 1000 rows at 0 ms upstream, 50 in flight: supervisor + bridge CPU per work item during
   dispatch, ``--ray`` over local (target <= 1.2x), with a node agent's items in batched actor
   calls (the default) and with one actor call per item (``ROLLBRIDGE_RAY_BATCH=0``, the
   baseline): the medians of ``BENCH_ROUNDS`` (default 3) interleaved rounds. The node agent's
   and its server's CPU are not the supervisor's and are not counted.
2. 1000 rows at a 1 s upstream, 200 in flight (each node's replica gets about half): dispatch
   wall (first dispatch -> last result), ``--ray`` over local (target <= 1.2x); and, for the
   record, the CPU per item of these two runs (the same work at the same pace).

Each line prints the two figures and their ratio; nothing here is a pass/fail test.

``--threads`` also prints, for each fast run, where the supervisor's CPU during dispatch went:
by thread (``/proc/<pid>/task/*/schedstat``, grouped by thread name, trio's worker threads as
one; a thread that ended counts up to
its last sample, and what no sample saw shows as "unseen"), the bridge's process, and how many connections node 2
opened to the bridge's door on the head (each one a TLS handshake). ``--cpu-only`` skips case 2.
``--pin`` gives the supervisor and its bridge the first core and everything else (this process
with the fake provider, both nodes' Ray processes, the rollout servers) the others, in every
run alike (2026-12-03: it made ``--ray`` relatively worse, 1.65x against 1.29x unpinned: the
supervisor's Ray threads then share its one core). ``--machines`` models two machines of one
core each: the head (this process with the fake provider, the head's Ray, the supervisor, its
bridge and rollout server) on the first core and node 2 (``RB_N2_CPUS`` for
``scripts/ray-testbed``: everything it starts inherits it) on the other, so the local run is the
same work on the head's machine alone. ``--control`` adds to each round of case 1 a local run
with node 2's load beside it: two processes burning, in 1 ms slices of Python, as much CPU as
node 2's processes used during that round's batched ``--ray`` dispatch (read from their network
namespace); it tells whether that load alone inflates the supervisor's CPU per item.
``--journaled-fs`` puts the workspace and every run directory on a fresh ext4 file system
with a journal (``mkfs.ext4``'s default), loop-mounted for the invocation: this machine's root
file system has none, which makes each file created dearer after recent deletions
(``bench_eval._set_aside``; docs/scale-out.md).
``--probe`` runs a fixed unit of Python work every 3 ms beside every run (:data:`PROBE`) and
prints its CPU per unit during each dispatch: whether the machine itself is dearer for a process
that wakes often while ``--ray`` runs. ``--half`` adds to each round a local run at 25 in flight
(half the slots): what the head's processes pay per item when they hold half as many items at
once, as they do in a ``--ray`` run whose node 2 turns its slots over slowly. ``--guest`` adds to
each round a batched ``--ray`` run whose node agent runs trio in guest mode on Ray's loop
(``ROLLBRIDGE_AGENT_GUEST=1``), the agent's former design. ``--plain`` adds to each round a
batched ``--ray`` run whose supervisor finds no ``openssl`` (:func:`_path_without_openssl`), so
the bridge's door serves node 2 over plain TCP (``RELAY_WITHOUT_TLS``): what the hop's TLS
costs the head, in the same invocation (a measurement only: a real run keeps TLS). Each fast
run's ``--threads`` line also gives node 2's CPU per item it ran and the head's rollout
server's per item it ran, and case 1 then prints that server's medians and each round's ratio
over its own (a process of the same work per item in both runs that knows nothing of Ray: what
it pays more in the ``--ray`` run is the shared machine and its fewer items at once).
``--parts`` times, in each ``--ray`` run's supervisor, a remote item's own steps on the trio
thread (``parts/sitecustomize.py``: the trial's unpack, the actor calls, the collects'
answers handed out) and prints them per run and as medians (the unpack's kernel work is what
moves most between invocations on this machine: docs/scale-out.md).
``BENCH_ROWS`` sets case 1's rows (default 1000).
``BENCH_AGAINST=DIR`` adds to each round of case 1 a batched ``--ray`` run from the source tree
DIR (before and after in one invocation); ``BENCH_PYSPY=DIR`` samples each measured supervisor
and its bridge with ``py-spy record --native`` (inflated figures: for finding hot spots).

Why one module of this size: it is one benchmark, its case, the samplers that explain it and
the flags that vary it; each part is used only here and read together with the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_eval
from bench_eval import REPO, dataset, parse_log, run_eval, serve_upstream, setup, target

TESTBED = REPO / "scripts" / "ray-testbed"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
#: ``BENCH_ROWS``: the rows of case 1 (default 1000): a larger run spreads what a run pays once
#: inside its dispatch (node 2's TLS handshakes, its first calls) over more items.
ROWS = int(os.environ.get("BENCH_ROWS", "1000"))
#: ``--parts``: the directory whose ``sitecustomize`` times a remote item's own steps.
PARTS = Path(__file__).resolve().parent / "parts"
LOCK = "/tmp/rollbridge-ray-testbed.lock"  # as tests/cluster/conftest.py: one test bed at a time
#: ``BENCH_PYSPY=DIR``: sample each measured supervisor (and its bridge) with py-spy into DIR
#: (as ``bench_eval.py --py-spy``; profiled figures are inflated: for hot spots only).
PYSPY_DIR = Path(os.environ["BENCH_PYSPY"]).resolve() if os.environ.get("BENCH_PYSPY") else None
#: ``BENCH_AGAINST=DIR``: each round also runs ``--ray`` batched from the source tree DIR (on
#: ``PYTHONPATH``, as ``bench_eval.py --against``): before and after in one invocation.
AGAINST = Path(os.environ["BENCH_AGAINST"]).resolve() if os.environ.get("BENCH_AGAINST") else None


def _path_without_openssl(into: Path) -> str:
    """A ``PATH`` of one directory, ``into``, holding a symlink to every executable on this
    ``PATH`` (the first of each name) except ``openssl``."""
    into.mkdir(parents=True, exist_ok=True)
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        with contextlib.suppress(OSError):
            for name in os.listdir(entry):
                link = into / name
                if name != "openssl" and not link.is_symlink():
                    link.symlink_to(Path(entry) / name)
    return str(into)


@contextlib.contextmanager
def _journaled_fs() -> Iterator[Path]:
    """A fresh 8 GB (sparse) ext4 file system with a journal, loop-mounted under ``.bench/``;
    unmounted and its image deleted at the end."""
    base = REPO / ".bench"
    base.mkdir(exist_ok=True)
    image, mount = base / f"ext4-{os.getpid()}.img", base / f"ext4-{os.getpid()}"
    with open(image, "wb") as f:
        f.truncate(8 << 30)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        mount.mkdir()
        subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
        try:
            yield mount
        finally:
            subprocess.run(["umount", str(mount)], check=False)
    finally:
        image.unlink()
        with contextlib.suppress(OSError):
            mount.rmdir()


def _testbed(command: str, directory: Path) -> None:
    subprocess.run(
        [str(TESTBED), command, str(directory)],
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
        timeout=240,
    )


def _read_env(directory: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in (directory / "env").read_text().splitlines():
        for pair in line.removeprefix("export ").split():
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def _line(what: str, local: dict[str, Any], ray: dict[str, Any], key: str, unit: str) -> None:
    print(
        f"   {what}: local {local[key]:.3f}{unit}, --ray {ray[key]:.3f}{unit}, "
        f"ratio {ray[key] / local[key]:.2f}"
    )


def _control(
    what: str, whose: str, unit: str, runs: dict[str, list[float]], control: dict[str, list[float]]
) -> None:
    """A control's medians (local, batched), and each round's own ratio over the control's."""
    medians = [{unit: statistics.median(control[k])} for k in ("local", "batched")]
    _line(what, medians[0], medians[1], unit, unit)
    fair = sorted(
        (r / lo) / (cr / cl)
        for r, lo, cr, cl in zip(
            runs["batched"], runs["local"], control["batched"], control["local"], strict=True
        )
    )
    print(
        f"   each round's own ratio over {whose} ratio: median "
        f"{statistics.median(fair):.2f}, range {fair[0]:.2f} to {fair[-1]:.2f}"
    )


class ThreadSampler:
    """Per-thread CPU of the supervisor at each of ``run_eval``'s samples, and the peers of the
    connections accepted on the head's cluster address (the bridge's door's)."""

    def __init__(self, head_ip: str) -> None:
        self.head_ip = head_ip
        self.samples: list[tuple[float, float, dict[int, tuple[str, float]], float]] = []
        self.peers: set[tuple[str, int]] = set()
        self.node2: list[dict[int, float]] = []  # at each sample: node 2's processes' CPU
        self._netns: dict[int, bool] = {}  # pid -> in node 2's network namespace (looked up once)
        self.node2_rate = 0.0
        """Node 2's processes' CPU per second of dispatch (cores), set by :meth:`report`."""
        self.server: list[dict[int, float]] = []  # at each sample: the head's rollout server's
        self.server_ms = 0.0
        """The head's rollout server's CPU per item it ran (ms), set by :meth:`report`."""

    def __call__(
        self,
        now: float,
        ps: psutil.Process,
        bridge: psutil.Process | None,
        others: dict[int, float],
    ) -> None:
        threads: dict[int, tuple[str, float]] = {}
        for task in Path(f"/proc/{ps.pid}/task").iterdir():
            try:  # schedstat: nanoseconds on the CPU (stat's ticks are 10 ms coarse)
                ran = int((task / "schedstat").read_text().split()[0]) / 1e9
                comm = (task / "comm").read_text().strip()
            except (OSError, ValueError, IndexError):
                continue
            threads[int(task.name)] = (comm, ran)
        total = sum(ps.cpu_times()[:2])
        bridge_cpu = self.samples[-1][3] if self.samples else 0.0
        if bridge is not None:
            with contextlib.suppress(psutil.Error):  # max: an exited bridge reads as 0 CPU
                bridge_cpu = max(bridge_cpu, sum(bridge.cpu_times()[:2]))
        for holder in (ps, bridge):  # the bridge serves them since the door hands them over
            if holder is None:
                continue
            with contextlib.suppress(psutil.Error):
                for conn in holder.net_connections("tcp"):
                    if conn.laddr and conn.laddr.ip == self.head_ip and conn.raddr:
                        self.peers.add((conn.raddr.ip, conn.raddr.port))
        self.samples.append((now, total, threads, bridge_cpu))
        self.node2.append(self._node2_cpu())
        self.server.append(others)

    def _node2_cpu(self) -> dict[int, float]:
        """CPU seconds of each process in node 2's network namespace (empty without one); a
        process's namespace is looked up the first time its pid is seen, not at every sample."""
        try:
            netns = os.stat(f"/run/netns/{os.environ.get('RB_NETNS', 'rb-n2')}").st_ino
        except OSError:
            return {}
        cpu: dict[int, float] = {}
        for pid in psutil.pids():
            with contextlib.suppress(OSError, psutil.Error):
                if pid not in self._netns:
                    self._netns[pid] = os.stat(f"/proc/{pid}/ns/net").st_ino == netns
                if self._netns[pid]:
                    cpu[pid] = sum(psutil.Process(pid).cpu_times()[:2])
        return cpu

    def report(self, ws: Path, name: str) -> None:
        log = parse_log(ws / ".osmosis" / "evals" / name / "logs.txt")
        items = log["finished"]
        before = [s for s in self.samples if s[0] <= log["first_dispatch"]] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= log["last_finish"]] or self.samples[-1:]
        (t0, total0, threads0, bridge0), (t1, total1, _, bridge1) = before[-1], after[0]
        last: dict[int, tuple[str, float]] = {}  # each thread's last sample in the bracket
        for when, _, threads, _ in self.samples:
            if t0 <= when <= t1:
                last.update(threads)
        by_name: dict[str, float] = {}
        for tid, (comm, cpu) in last.items():
            # trio names a worker thread after its job ("<function> from <task>"), truncated
            group = (
                "trio workers"
                if comm.startswith("Trio thread") or " from " in comm
                else comm.rstrip("0123456789")
            )
            by_name[group] = by_name.get(group, 0.0) + cpu - threads0.get(tid, (comm, 0.0))[1]
        i0, i1 = self.samples.index(before[-1]), self.samples.index(after[0])
        first, final = self.node2[i0], {}
        for seen in self.node2[i0 : i1 + 1]:  # a process that ended counts to its last sample
            final.update(seen)
        node2 = sum(cpu - first.get(pid, 0.0) for pid, cpu in final.items())
        self.node2_rate = node2 / max(t1 - t0, 1e-9)
        first, final = self.server[i0], {}
        for seen in self.server[i0 : i1 + 1]:
            final.update(seen)
        remote = _remote(ws, name)
        head_items = items - remote
        server = sum(cpu - first.get(pid, 0.0) for pid, cpu in final.items())
        self.server_ms = server / max(head_items, 1) * 1000
        ended = (total1 - total0) - sum(by_name.values())
        parts = sorted(by_name.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{k!r} {v / items * 1000:.3f}" for k, v in parts if v > 0.0)
        print(
            f"     {name}: process {(total1 - total0) / items * 1000:.3f} ms/item "
            f"({shown}, unseen {ended / items * 1000:.3f}); "
            f"bridge {(bridge1 - bridge0) / items * 1000:.3f} ms/item; "
            f"connections from node 2: {len(self.peers)}; "
            f"node 2's processes {self.node2_rate:.2f} cores"
            + (f", {node2 / remote * 1000:.3f} ms per item it ran ({remote}); " if remote else "; ")
            + f"the head's rollout server {self.server_ms:.3f} ms per item it ran ({head_items})"
        )


#: ``--control``'s stand-in for node 2's load: ``cores`` of CPU (over 2 processes), each a
#: Python loop of small allocations, JSON and hashing in 1 ms slices, sleeping in between (so it
#: wakes as often as a server does).
BURNER = """
import hashlib, json, sys, time
share = float(sys.argv[1])
doc = {"messages": [{"role": "user", "content": "x" * 200}] * 8, "n": 0}
while True:
    start = time.thread_time()
    while time.thread_time() - start < 0.001:
        doc["n"] += 1
        hashlib.sha256(json.dumps(doc).encode()).hexdigest()
        json.loads(json.dumps(doc))
    time.sleep(0.001 * (1.0 - share) / share)
"""


@contextlib.asynccontextmanager
async def _burning(cores: float) -> Any:
    """Run :data:`BURNER` at ``cores`` of CPU (two processes) while the block runs."""
    share = min(max(cores / 2, 0.01), 1.0)
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(
                partial(trio.run_process, [sys.executable, "-c", BURNER, str(share)], check=False)
            )
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


#: ``--probe``: a fixed unit of Python work (JSON, hashing, small dicts: what the servers do)
#: every 3 ms, each unit's thread CPU written as ``(wall time, ns)``; how dear the same
#: instructions are for a process that wakes often beside a run, whatever the run's own work.
PROBE = """
import hashlib, json, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
doc = {"messages": [{"role": "user", "content": "x" * 120, "n": i} for i in range(6)]}
while True:
    time.sleep(0.003)
    when = time.time()
    start = time.thread_time_ns()
    text = json.dumps(doc)
    back = json.loads(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    index = {m["n"]: m["content"][:8] + digest[:4] for m in back["messages"]}
    os.write(fd, struct.pack("<dq", when, time.thread_time_ns() - start))
"""


def _probe_unit_us(path: Path, run: dict[str, Any]) -> float:
    """The probe's mean CPU per unit (us) between ``run``'s first dispatch and last result."""
    data = path.read_bytes()
    costs = [
        ns
        for when, ns in struct.iter_unpack("<dq", data[: len(data) // 16 * 16])
        if run["first_dispatch"] <= when <= run["last_finish"]
    ]
    return statistics.fmean(costs) / 1000 if costs else float("nan")


def _remote(ws: Path, name: str) -> int:
    """How many of run ``name``'s rollouts ran on node 2."""
    log = (ws / ".osmosis" / "evals" / name / "logs.txt").read_text()
    return log.count("rollout finished on replica")


def _report_parts(
    directory: Path, name: str, items: int, remote: int, medians: dict[str, list[float]]
) -> None:
    """``--parts``: print what :data:`PARTS`'s probe measured in run ``name``."""
    measured = json.loads((directory / f"{name}.json").read_text())
    unpacks, unpack_s = measured.get("unpack", [0, 0.0])
    calls, call_s = measured.get("call", [0, 0.0])
    collects, collect_s = measured.get("collected", [0, 0.0])
    whole = (unpack_s + call_s + collect_s) / items * 1000
    calling = (
        f"actor calls {call_s / calls * 1e6:.0f} us each ({calls}, {remote / calls:.1f} items "
        f"per call); answers handed out {collect_s / max(collects, 1) * 1e6:.0f} us per "
        f"collect ({collects})"
        if calls
        else "one run_item call per item (not timed)"
    )
    print(
        f"     {name}: the trio thread's unpack {unpack_s / max(unpacks, 1) * 1e6:.0f} us per "
        f"remote trial ({unpacks}); {calling}; these parts {whole:.3f} ms per item of all items"
    )
    if name.startswith("fast-ray-") and not name.startswith("fast-ray-per-item"):
        medians.setdefault("unpack us per remote trial", []).append(
            unpack_s / max(unpacks, 1) * 1e6
        )
        medians.setdefault("these parts, ms per item of all items", []).append(whole)


async def main(directory: Path, flags: set[str]) -> None:
    threads, cpu_only, control = "--threads" in flags, "--cpu-only" in flags, "--control" in flags
    guest, probe, half = "--guest" in flags, "--probe" in flags, "--half" in flags
    plain = "--plain" in flags
    parts: dict[str, list[float]] | None = {} if "--parts" in flags else None
    if parts is not None:
        (directory / "parts").mkdir()
        os.environ["BENCH_PARTS_DIR"] = str(directory / "parts")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PARTS), os.environ.get("PYTHONPATH")) if p
        )
    ws = setup()
    # The workspace lives under the repo's ignored .bench/: its own git repository, so the
    # rollout's files are shipped to node 2 (the bundle lists a checkout's files through git).
    await trio.run_process(["git", "init", "-q", str(ws)])
    config = dataset(ws, 1000)
    fast_config = dataset(ws, ROWS)
    warm = dataset(ws, 200)
    address = _read_env(directory)["RB_ADDRESS"]
    os.environ.update(_read_env(directory))
    ray = ("--ray", address)
    head_ip = address.rsplit(":", 1)[0]

    async def fast(
        name: str,
        extra: tuple[str, ...] = (),
        tree: Path | None = None,
        sampler: ThreadSampler | None = None,
        in_flight: int = 50,
    ) -> dict[str, Any]:
        if sampler is None and threads:
            sampler = ThreadSampler(head_ip)
        bench_eval.PYSPY_DIR = PYSPY_DIR  # the measured runs only, not the warm-ups
        try:
            run = await run_eval(
                ws,
                fast_config,
                name,
                upstream,
                in_flight,
                tree=tree,
                extra=extra,
                on_sample=sampler,
            )
        finally:
            bench_eval.PYSPY_DIR = None
        if sampler is not None:
            sampler.report(ws, name)
            run["server_ms"] = sampler.server_ms
        if probe:
            run["probe_us"] = _probe_unit_us(probe_file, run)
            print(f"     {name}: the probe {run['probe_us']:.1f} us per unit")
        if parts is not None and "ray" in name:
            _report_parts(directory / "parts", name, run["finished"], _remote(ws, name), parts)
        return run

    probe_file = ws / "probe.bin"
    probe_file.unlink(missing_ok=True)

    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_upstream)
        if probe:
            nursery.start_soon(
                partial(
                    trio.run_process, [sys.executable, "-c", PROBE, str(probe_file)], check=False
                )
            )
        await run_eval(ws, warm, "warmup", upstream, 50)
        await run_eval(ws, warm, "warmup-ray", upstream, 50, extra=ray)

        await upstream.set_delay(0.0)
        key = "dispatch_cpu_ms_per_item"
        inner = "dispatch_inner_cpu_ms_per_item"
        runs: dict[str, list[float]] = {"local": [], "per-item": [], "batched": []}
        inside: dict[str, list[float]] = {"local": [], "batched": []}
        probed: dict[str, list[float]] = {"local": [], "batched": []}
        served: dict[str, list[float]] = {"local": [], "batched": []}  # --threads
        if AGAINST is not None:
            runs["batched, before"] = []
        if control:
            runs["local, node 2's load beside"] = []
        if guest:
            runs["batched, agent in guest mode"] = []
        if half:
            runs["local, 25 in flight"] = []
        if plain:
            runs["batched, plain TCP"] = []
            plain_path = _path_without_openssl(directory / "no-openssl")
        for n in range(ROUNDS):  # interleaved, so the host's drift hits all three alike
            run = await fast(f"fast-local-{n}")
            runs["local"].append(run[key])
            inside["local"].append(run[inner])
            probed["local"].append(run.get("probe_us", 0.0))
            served["local"].append(run.get("server_ms", 0.0))
            if half:
                run = await fast(f"fast-local-half-{n}", in_flight=25)
                runs["local, 25 in flight"].append(run[key])
            os.environ["ROLLBRIDGE_RAY_BATCH"] = "0"
            run = await fast(f"fast-ray-per-item-{n}", ray)
            runs["per-item"].append(run[key])
            remote = [_remote(ws, f"fast-ray-per-item-{n}")]
            del os.environ["ROLLBRIDGE_RAY_BATCH"]
            sampler = ThreadSampler(head_ip)
            run = await fast(f"fast-ray-{n}", ray, sampler=sampler)
            runs["batched"].append(run[key])
            inside["batched"].append(run[inner])
            probed["batched"].append(run.get("probe_us", 0.0))
            served["batched"].append(run.get("server_ms", 0.0))
            remote.append(_remote(ws, f"fast-ray-{n}"))
            if control:
                async with _burning(sampler.node2_rate):
                    run = await fast(f"fast-local-loaded-{n}")
                runs["local, node 2's load beside"].append(run[key])
            if guest:
                os.environ["ROLLBRIDGE_AGENT_GUEST"] = "1"
                run = await fast(f"fast-ray-guest-{n}", ray)
                del os.environ["ROLLBRIDGE_AGENT_GUEST"]
                runs["batched, agent in guest mode"].append(run[key])
            if plain:
                with_tls, os.environ["PATH"] = os.environ["PATH"], plain_path
                try:
                    run = await fast(f"fast-ray-plain-{n}", ray)
                finally:
                    os.environ["PATH"] = with_tls
                log = ws / ".osmosis" / "evals" / f"fast-ray-plain-{n}" / "logs.txt"
                if '"tls":false' not in log.read_text():
                    raise SystemExit("--plain: the run's door still served TLS (openssl found)")
                runs["batched, plain TCP"].append(run[key])
            if AGAINST is not None:
                run = await fast(f"fast-ray-before-{n}", ray, tree=AGAINST)
                runs["batched, before"].append(run[key])
            print(
                f"   round {n + 1}: "
                + ", ".join(f"{k} {v[-1]:.3f} ms" for k, v in runs.items())
                + f" (on node 2: per-item {remote[0]}, batched {remote[1]} items)"
            )
        medians = {k: {key: statistics.median(v)} for k, v in runs.items()}
        local, per_item, spread = medians["local"], medians["per-item"], medians["batched"]
        before = [medians["batched, before"]] if AGAINST is not None else []
        print(f"1) {ROWS} rows, 0 ms upstream, 50 in flight (median of {ROUNDS} rounds)")
        _line("supervisor CPU per item, dispatch, one call per item", local, per_item, key, "ms")
        _line("supervisor CPU per item, dispatch, batched calls", local, spread, key, "ms")
        if before:
            _line("the same, the tree BENCH_AGAINST (before)", local, before[0], key, "ms")
        if guest:
            _line(
                "the same, node 2's agent in guest mode (--guest)",
                local,
                medians["batched, agent in guest mode"],
                key,
                "ms",
            )
        if plain:
            _line(
                "the same, node 2's calls over plain TCP (--plain: no TLS on the hop)",
                local,
                medians["batched, plain TCP"],
                key,
                "ms",
            )
        _line(
            "the same, strictly inside dispatch (no edge's 50 ms)",
            {inner: statistics.median(inside["local"])},
            {inner: statistics.median(inside["batched"])},
            inner,
            "ms",
        )
        paired = sorted(r / lo for r, lo in zip(runs["batched"], runs["local"], strict=True))
        print(
            "   each round's own ratio, batched / local (the target line below divides the "
            f"medians): median {statistics.median(paired):.2f}, range {paired[0]:.2f} to "
            f"{paired[-1]:.2f}"
        )
        if probe:
            _control("the probe's CPU per unit of fixed work beside the runs (--probe)",
                     "its probe's", "us", runs, probed)  # fmt: skip
        if all(served["local"]) and all(served["batched"]):
            # The head's rollout server does the same work per item in both runs and knows
            # nothing of Ray: what it pays more per item in the --ray run is the shared machine
            # and the half-full replica, not the replica path.
            _control("the head's rollout server's CPU per item it ran (--threads)",
                     "its head rollout server's", "ms", runs, served)  # fmt: skip
        if half:
            _line(
                "batched --ray over a local run at 25 in flight (--half)",
                medians["local, 25 in flight"],
                spread,
                key,
                "ms",
            )
        if control:
            loaded = medians["local, node 2's load beside"]
            _line(
                "the same, local with node 2's load beside it (--control)",
                loaded,
                spread,
                key,
                "ms",
            )
        for part, values in (parts or {}).items():
            print(
                f"   --parts, batched runs, {part}: median {statistics.median(values):.3f}, "
                f"range {min(values):.3f} to {max(values):.3f}"
            )
        target(
            "supervisor CPU per item, --ray / local",
            spread["dispatch_cpu_ms_per_item"] / local["dispatch_cpu_ms_per_item"],
            1.2,
            "x",
        )

        if cpu_only:
            nursery.cancel_scope.cancel()
            return
        await upstream.set_delay(1.0)
        local = await run_eval(ws, config, "latency-local", upstream, 200)
        spread = await run_eval(ws, config, "latency-ray", upstream, 200, extra=ray)
        print(f"2) 1000 rows, 1 s upstream, 200 in flight ({_remote(ws, 'latency-ray')} on node 2)")
        _line("dispatch wall", local, spread, "dispatch_wall_s", "s")
        # The same work at the same pace (both runs wait on the upstream): CPU per item.
        _line("supervisor CPU per item, dispatch", local, spread, key, "ms")
        target(
            "latency-bound dispatch wall, --ray / local",
            spread["dispatch_wall_s"] / local["dispatch_wall_s"],
            1.2,
            "x",
        )
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("bench_ray needs root (it starts scripts/ray-testbed)")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Short: Ray's unix sockets live under it.
    bed = Path(tempfile.mkdtemp(prefix="rtb-", dir="/tmp"))
    lock = open(LOCK, "w")  # noqa: SIM115 - held for the benchmark, closed at exit
    fcntl.flock(lock, fcntl.LOCK_EX)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    if "--pin" in sys.argv:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            sys.exit("--pin needs 2 cores")
        # The supervisor and its bridge get the first core; this process (the fake provider),
        # the test bed's Ray processes (both nodes) and the rollout servers the others.
        bench_eval.PIN = ({cores[0]}, set(cores[1:]))
        for task in Path("/proc/self/task").iterdir():
            os.sched_setaffinity(int(task.name), bench_eval.PIN[1])
        print(
            f"pinned: supervisor and bridge on {bench_eval.PIN[0]}, the rest on {bench_eval.PIN[1]}"
        )
    if "--machines" in sys.argv:
        if "--pin" in sys.argv or "--control" in sys.argv:
            sys.exit("--machines places every process itself: not with --pin or --control")
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            sys.exit("--machines needs 2 cores")
        # The head (this process with the fake provider, the head's Ray, the supervisor, its
        # bridge and its rollout server: all inherit it) on the first core, node 2 on the others.
        for task in Path("/proc/self/task").iterdir():
            os.sched_setaffinity(int(task.name), {cores[0]})
        os.environ["RB_N2_CPUS"] = ",".join(map(str, cores[1:]))
        print(f"machines: the head on core {cores[0]}, node 2 on {os.environ['RB_N2_CPUS']}")
    with contextlib.ExitStack() as stack:
        if "--journaled-fs" in sys.argv:
            if shutil.which("mkfs.ext4") is None:
                sys.exit("--journaled-fs needs mkfs.ext4 (e2fsprogs)")
            bench_eval.BENCH = stack.enter_context(_journaled_fs()) / "eval"
            print(f"run directories on a fresh ext4 with a journal: {bench_eval.BENCH}")
        try:
            _testbed("up", bed)
            trio.run(main, bed, set(sys.argv[1:]))
        finally:
            _testbed("down", bed)
            shutil.rmtree(bed, ignore_errors=True)
            print(f"load average {os.getloadavg()[0]:.2f}")
            lock.close()
