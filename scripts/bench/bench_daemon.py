"""Benchmark the daemon's event stream, in one run.

* Event latency: a writer process appends journal records at ~200 items/s, fsyncing each, and
  notes the time right after each fsync; an SSE client on the daemon's unix socket notes when
  each record arrives. p50/p99 of the difference, against a baseline measured in the same run:
  a bare file tail in the client's own process polling at the daemon's interval.
* Cost of following: the daemon's CPU (percent of one core) and RSS while 4 writers run at
  ~50 items/s each with one SSE client per run, against the same daemon idle.

The writers stand in for run children: each is recorded in ``.osmosis/daemon/runs/`` with its
pid and start token before the daemon starts, so the daemon adopts them as live runs.

Run: ``.venv/bin/python scripts/bench/bench_daemon.py`` (about half a minute).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402
import trio  # noqa: E402

from launcher.daemon.children import ChildRecord  # noqa: E402
from launcher.daemon.discovery import live_daemon  # noqa: E402
from launcher.daemon.stream import POLL_S, LineTail  # noqa: E402
from launcher.process import start_token  # noqa: E402
from launcher.rundir.logs import utc_now_iso  # noqa: E402

WRITER = r"""
import json, os, sys, time
path, rate, count, delay = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
time.sleep(delay)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
stamps = []
start = time.monotonic()
for i in range(count):
    target = start + i / rate
    pause = target - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    rec = {"duration_ms": 1.0, "rollout_id": "r%d" % i, "row_index": i, "run_index": 0,
           "status": "success", "reward": 1.0}
    os.write(fd, (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode())
    os.fsync(fd)
    stamps.append(time.time())
print(json.dumps(stamps))
"""


def _writer(ws: Path, name: str, rate: float, count: int, delay: float) -> subprocess.Popen[str]:
    run = ws / ".osmosis" / "evals" / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "progress.json").write_text(json.dumps({"total_runs": count}))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(run / "events.jsonl"),
            str(rate),
            str(count),
            str(delay),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    runs = ws / ".osmosis" / "daemon" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    ChildRecord(
        name=name,
        pid=proc.pid,
        start_token=start_token(proc.pid) or "",
        started_at=utc_now_iso(),
        log_offset=0,
    ).save(runs)
    return proc


async def _follow(sock: str, name: str, arrivals: dict[int, float]) -> None:
    transport = httpx.AsyncHTTPTransport(uds=sock)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://d", timeout=None) as client,
        client.stream("GET", f"/v1/runs/{name}/events") as response,
    ):
        event_id = None
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: ") and event_id is not None:
                arrivals[event_id] = time.time()
                event_id = None
            elif line.startswith("event: end"):
                return


async def _bare_tail(path: Path, count: int, arrivals: dict[int, float]) -> None:
    tail = LineTail(path)
    while len(arrivals) < count:
        for number, _ in tail.read_new():
            arrivals[number] = time.time()
        await trio.sleep(POLL_S)


def _percentiles(stamps: list[float], arrivals: dict[int, float]) -> tuple[float, float]:
    lat = sorted((arrivals[i + 1] - t) * 1000 for i, t in enumerate(stamps) if i + 1 in arrivals)
    return statistics.median(lat), lat[int(len(lat) * 0.99) - 1]


def _start_daemon(ws: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "daemon", "--workspace", str(ws)],
        stdout=subprocess.DEVNULL,
        env=env,
    )
    while live_daemon(ws) is None:
        time.sleep(0.05)
    return proc


async def _latency(ws: Path) -> dict[str, Any]:
    count = 1000
    writer = _writer(ws, "lat", 200.0, count, 1.5)
    daemon = _start_daemon(ws)
    info = live_daemon(ws)
    assert info is not None
    via_daemon: dict[int, float] = {}
    bare: dict[int, float] = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_follow, info.socket, "lat", via_daemon)
            nursery.start_soon(
                _bare_tail, ws / ".osmosis" / "evals" / "lat" / "events.jsonl", count, bare
            )
    stamps = json.loads(writer.communicate()[0])
    daemon.terminate()
    daemon.wait()
    d50, d99 = _percentiles(stamps, via_daemon)
    b50, b99 = _percentiles(stamps, bare)
    return {"received": len(via_daemon), "daemon_ms": (d50, d99), "bare_ms": (b50, b99)}


async def _following(ws: Path) -> dict[str, Any]:
    names = [f"f{i}" for i in range(4)]
    writers = [_writer(ws, n, 50.0, 500, 4.0) for n in names]
    daemon = _start_daemon(ws)
    info = live_daemon(ws)
    assert info is not None
    ps = psutil.Process(daemon.pid)
    ps.cpu_percent()
    await trio.sleep(2.0)
    idle_cpu, idle_rss = ps.cpu_percent(), ps.memory_info().rss
    arrivals: list[dict[int, float]] = [{} for _ in names]
    samples: list[tuple[float, int]] = []

    async def sample() -> None:
        await trio.sleep(5.0)  # the writers start after 4 s: measure while all four stream
        ps.cpu_percent()
        for _ in range(8):
            await trio.sleep(1.0)
            samples.append((ps.cpu_percent(), ps.memory_info().rss))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for name, seen in zip(names, arrivals, strict=True):
                nursery.start_soon(_follow, info.socket, name, seen)
            nursery.start_soon(sample)
    for w in writers:
        w.communicate()
    daemon.terminate()
    daemon.wait()
    cpu = statistics.mean(c for c, _ in samples)
    rss = max(r for _, r in samples)
    return {
        "received": [len(a) for a in arrivals],
        "idle": (idle_cpu, idle_rss),
        "following": (cpu, rss),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rbd-") as tmp:
        lat = trio.run(_latency, Path(tmp) / "a")
        fol = trio.run(_following, Path(tmp) / "b")
    d50, d99 = lat["daemon_ms"]
    b50, b99 = lat["bare_ms"]
    print(f"event latency fsync->SSE at 200 items/s ({lat['received']} of 1000 records received)")
    print(f"  daemon SSE : p50 {d50:6.2f} ms  p99 {d99:6.2f} ms")
    print(f"  bare tail  : p50 {b50:6.2f} ms  p99 {b99:6.2f} ms  (baseline, same poll interval)")
    print(f"  ratio      : p50 x{d50 / b50:.2f}  p99 x{d99 / b99:.2f}")
    (icpu, irss), (fcpu, frss) = fol["idle"], fol["following"]
    print(f"daemon following 4 runs at 50 items/s each (records received {fol['received']})")
    print(f"  idle       : CPU {icpu:5.1f} %  RSS {irss / 2**20:6.1f} MiB")
    print(f"  following  : CPU {fcpu:5.1f} %  RSS {frss / 2**20:6.1f} MiB")
    print(f"  ratio      : RSS x{frss / irss:.2f}, CPU +{fcpu - icpu:.1f} points")


if __name__ == "__main__":
    main()
