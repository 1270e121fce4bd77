"""A large journal or log goes out in bounded pieces (launcher.daemon.stream), so a replay never
holds a whole file, and a client that stops reading is dropped."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import trio
import trio.testing

from launcher.daemon.api import ControlApp
from launcher.daemon.listen import bind_tcp, serve
from launcher.daemon.registry import Registry
from launcher.daemon.stream import READ_LIMIT, LineTail, journal_events, log_events, tail_lines
from tests.launcher.test_runs import make_run

ROWS = 20_000


def _big_run(root: Path) -> Path:
    records = [
        {"row_index": i, "status": "success", "reward": 1.0, "metrics": {"pad": "x" * 150}}
        for i in range(ROWS)
    ]
    run = make_run(root, "big", records=records, total=ROWS)
    (run / "progress.json").write_text(json.dumps({"total_runs": ROWS}))
    (run / "logs.txt").write_text("".join(f"line {i} " + "y" * 100 + "\n" for i in range(ROWS)))
    return run


def test_a_tail_reads_a_large_file_in_bounded_pieces(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    long_line = b"z" * (3 * READ_LIMIT)
    path.write_bytes(b"".join(b"%d\n" % i for i in range(200_000)) + long_line + b"\nlast")
    tail = LineTail(path)
    numbers: list[int] = []
    while True:
        batch = tail.read_new()
        if not batch:
            break
        size = sum(len(raw) + 1 for _, raw in batch)
        assert size <= READ_LIMIT or [raw for _, raw in batch] == [long_line]
        numbers += [n for n, _ in batch]
    assert numbers == list(range(1, 200_002)) and not tail.behind  # "last" has no newline yet


async def test_a_replay_is_sent_in_bounded_frames(tmp_path: Path) -> None:
    run = _big_run(tmp_path)
    assert (run / "events.jsonl").stat().st_size > 8 * READ_LIMIT
    ids: list[int] = []
    frames = 0
    with trio.fail_after(60):
        async for frame in journal_events(
            run, after=0, live=lambda: False, state=lambda: {"state": "finished"}
        ):
            frames += 1
            assert len(frame) <= 2 * READ_LIMIT
            ids += [int(line[4:]) for line in frame.decode().split("\n") if line.startswith("id: ")]
        assert ids == list(range(1, ROWS + 1)) and frames > 8
        logs: list[bytes] = []
        async for frame in log_events(run / "logs.txt", after=ROWS - 5000, live=lambda: False):
            assert len(frame) <= 2 * READ_LIMIT
            logs.append(frame)
    got = [line for line in b"".join(logs).decode().split("\n") if line.startswith("id: ")]
    assert [int(line[4:]) for line in got] == list(range(ROWS - 4999, ROWS + 1))
    assert tail_lines(run / "logs.txt", 3) == (
        ROWS - 3,
        [f"line {i} " + "y" * 100 for i in range(ROWS - 3, ROWS)],
    )


async def _shutdown(cancel: bool) -> None:
    raise AssertionError("not asked for")


def _info() -> dict[str, Any]:
    return {"version": "test", "pid": 1, "runs_active": []}


async def test_a_client_that_stops_reading_is_dropped(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # Virtual time moves only after a second of real idleness, so that it never runs ahead of
    # the server's file work on worker threads.
    autojump_clock.autojump_threshold = 1.0
    workspace = tmp_path / "ws"
    (workspace / "configs" / "eval").mkdir(parents=True)
    _big_run(workspace / ".osmosis" / "evals")
    size = (workspace / ".osmosis" / "evals" / "big" / "events.jsonl").stat().st_size
    app = ControlApp(Registry(workspace, nursery), _info, _shutdown)
    sock = bind_tcp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    await nursery.start(serve, [(sock, app)])
    with trio.fail_after(1000):
        client = trio.socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await client.connect(("127.0.0.1", port))
        await client.send(b"GET /v1/runs/big/events HTTP/1.1\r\nhost: x\r\n\r\n")
        await trio.sleep(300)  # reads nothing for longer than the server's send timeout
        received = b""
        while True:
            try:
                chunk = await client.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        client.close()
    assert received.startswith(b"HTTP/1.1 200 ")
    assert b"event: end" not in received and len(received) < size // 2


def test_a_follow_counts_the_lines_without_keeping_them(tmp_path: Path) -> None:
    path = tmp_path / "logs.txt"
    path.write_text("".join(f"{i}\n" for i in range(10)))
    assert tail_lines(path, 3, keep=False) == (7, [])
    assert tail_lines(path, 30, keep=False) == (0, [])
    assert tail_lines(path, 3) == (7, ["7", "8", "9"])
