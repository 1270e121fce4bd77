"""``logs?tail=N`` and ``usage`` read a run's ``logs.txt`` in bounded time
(launcher.daemon.logscan): a tail is the one a read of the whole file gives, for any bytes, any
block size and a file that grew between two reads; and once a large log was read, a later tail
or usage reads only what was added to it, and the end."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.daemon import logscan
from launcher.daemon.api import ControlApp
from launcher.daemon.children import ChildRecord
from launcher.daemon.listen import bind_tcp, serve
from launcher.daemon.live_usage import LIVE_USAGE_FILE, dispatched_in, dispatched_keys
from launcher.daemon.logscan import TAIL_BLOCK
from launcher.daemon.registry import Registry
from launcher.daemon.stream import tail_lines
from launcher.process import start_token
from tests.launcher.test_runs import make_run, ok

TS = "2026-12-04T20:00:00.000000Z"
#: A large log: one line of NULs (a hole in a sparse file, so the test writes next to nothing).
HOLE = 200 << 20
#: Far less than the large log: what reading only its end and what was added may take.
FEW_BYTES = 4 << 20


def _whole_file_tail(path: Path, count: int, keep: bool = True) -> tuple[int, list[str]]:
    """The daemon's tail before it read from the end: every line of the file, in order."""
    kept: deque[bytes] = deque(maxlen=max(0, count) if keep else 0)
    total = 0
    with path.open("rb") as fh:
        for raw in fh:
            parts = raw.splitlines()
            total += len(parts)
            kept.extend(parts)
    if not keep:
        return max(0, total - count), []
    lines = [raw.decode("utf-8", "replace") for raw in kept]
    return total - len(lines), lines


def _bytes_read() -> int:
    """How many bytes this process has read (every thread, any file), from ``/proc``."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


needs_proc_io = pytest.mark.skipif(
    not Path("/proc/self/io").exists(), reason="counts the bytes read in /proc/self/io"
)

_PIECES = st.sampled_from(
    [
        b"a",
        b"a line",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        "é".encode(),
        "€".encode(),
        "😀".encode(),
        b"\xff",  # not UTF-8
        b"\xe2\x82",  # a character cut short
    ]
)
_DATA = st.lists(
    st.one_of(_PIECES, st.integers(min_value=1, max_value=300).map(lambda n: b"x" * n)),
    max_size=60,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(
    data=_DATA,
    cut=st.integers(min_value=0, max_value=4000),
    count=st.integers(min_value=-1, max_value=40),
    block=st.integers(min_value=1, max_value=40),
    keep=st.booleans(),
)
def test_a_tail_is_that_of_a_read_of_the_whole_file(
    tmp_path_factory: pytest.TempPathFactory,
    data: bytes,
    cut: int,
    count: int,
    block: int,
    keep: bool,
) -> None:
    path = tmp_path_factory.mktemp("tail") / "logs.txt"
    cut = min(cut, len(data))
    # Small blocks put their edges everywhere: inside a character, between "\r" and "\n",
    # inside a line many blocks long.
    with (
        mock.patch.object(logscan, "TAIL_BLOCK", block),
        mock.patch.object(logscan, "BLOCK", block + 3),
    ):
        path.write_bytes(data[:cut])
        assert tail_lines(path, count, keep=keep) == _whole_file_tail(path, count, keep)
        with path.open("ab") as fh:  # grown (perhaps a "\n" after a "\r" counted before)
            fh.write(data[cut:])
        assert tail_lines(path, count, keep=keep) == _whole_file_tail(path, count, keep)


def _euro_across_the_block_edge() -> bytes:
    data = b"head\n" + "€".encode() * 30_000 + b"\nend\n"
    while data[-TAIL_BLOCK] & 0xC0 != 0x80:  # not yet a continuation byte
        data = data[:5] + b"x" + data[5:]
    return data


def _crlf_across_the_block_edge() -> bytes:
    end = b"\n" + b"y" * 100 + b"\r\nlast\r\n"
    # The line it ends is two blocks long: a count that took "\r" and "\n" for two breaks
    # would stop before its start.
    data = b"zero\n" + b"w" * (2 * TAIL_BLOCK) + b"first\r" + end + b"y" * (TAIL_BLOCK - len(end))
    assert data[-TAIL_BLOCK - 1 : -TAIL_BLOCK + 1] == b"\r\n"
    return data


CASES = {
    "empty": b"",
    "no trailing newline": b"one\ntwo",
    "trailing newline": b"one\ntwo\n",
    "crlf": b"one\r\ntwo\r\nthree\r\n",
    "lone cr": b"a\rb\rc",
    "only newlines": b"\n\n\n",
    "lines longer than a block": b"x" * (3 * TAIL_BLOCK + 5)
    + b"\nshort\n"
    + b"y" * (2 * TAIL_BLOCK),
    "a character across the block edge": _euro_across_the_block_edge(),
    "crlf across the block edge": _crlf_across_the_block_edge(),
    "not utf-8": b"\xff\xfe\n\xe2\x82\nok\n",
}


@pytest.mark.parametrize("data", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 5, 1000])
def test_a_tail_of_each_kind_of_file(tmp_path: Path, data: bytes, count: int) -> None:
    path = tmp_path / "logs.txt"
    path.write_bytes(data)
    for keep in (True, False):
        assert tail_lines(path, count, keep=keep) == _whole_file_tail(path, count, keep)


def test_a_log_rewritten_or_replaced_is_counted_again(tmp_path: Path) -> None:
    path = tmp_path / "logs.txt"
    path.write_bytes(b"a\nb\nc\n")
    assert tail_lines(path, 1) == (2, ["c"])
    inode = path.stat().st_ino
    with path.open("r+b") as fh:  # the same file, other bytes where the count stopped
        fh.write(b"x\n" * 10)
    assert path.stat().st_ino == inode
    assert tail_lines(path, 1) == _whole_file_tail(path, 1) == (9, ["x"])
    other = tmp_path / "other.txt"
    other.write_bytes(b"only\n")
    other.replace(path)
    assert tail_lines(path, 5) == (0, ["only"])
    assert tail_lines(tmp_path / "missing.txt", 5) == (0, [])


def _large_log(path: Path, lines: list[bytes]) -> None:
    """A log of one line of :data:`HOLE` NULs (a hole: nothing written) and then ``lines``."""
    with path.open("wb") as fh:
        fh.truncate(HOLE)
        fh.seek(HOLE)
        fh.write(b"\n" + b"".join(line + b"\n" for line in lines))


@needs_proc_io
def test_a_large_log_is_held_in_blocks_and_then_read_only_where_it_grew(tmp_path: Path) -> None:
    path = tmp_path / "logs.txt"
    _large_log(path, [b"line %d" % i for i in range(1000)])
    tracemalloc.start()
    try:
        # The first tail counts the lines before its own (first_line) in blocks, and holds
        # none of the 200 MB line.
        assert tail_lines(path, 3) == (998, ["line 997", "line 998", "line 999"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < FEW_BYTES
    with path.open("ab") as fh:
        fh.write(b"".join(b"more %d\n" % i for i in range(1000)))
    before = _bytes_read()
    assert tail_lines(path, 2) == (1999, ["more 998", "more 999"])
    assert tail_lines(path, 2, keep=False) == (1999, [])
    assert tail_lines(path, 1) == (2000, ["more 999"])
    assert _bytes_read() - before < FEW_BYTES


_LINES = st.sampled_from(
    [
        f"{TS} INFO [schedule] running 2 work items",
        f"{TS} INFO [dispatch] dispatching rollout "
        + json.dumps({"rollout_id": "r1", "row_index": 1, "run_index": 0}),
        f"{TS} INFO [dispatch] dispatching rollout "
        + json.dumps({"rollout_id": "r2", "row_index": 2, "run_index": 1}),
        f"{TS} INFO [dispatch] dispatching rollout "
        + json.dumps({"rollout_id": "r1", "row_index": 7, "run_index": 3}),  # dispatched again
        f"{TS} INFO [dispatch] dispatching rollout "
        + json.dumps({"rollout_id": "r3", "row_index": 3, "run_index": 0})
        + "\r",
        "child output\r"
        + f"{TS} INFO [dispatch] dispatching rollout "
        + json.dumps({"rollout_id": "r4", "row_index": 4, "run_index": 0})
        + "\rmore output",
        f"{TS} INFO [dispatch] dispatching rollout not json",
        f"{TS} WARNING [cancel] rollout cancelled " + json.dumps({"rollout_id": "r1"}),
        "é€ and \udcff",
        "",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(_LINES, max_size=30),
    cut=st.integers(min_value=0, max_value=3000),
    block=st.integers(min_value=1, max_value=200),
)
def test_the_work_items_of_rollouts_are_those_of_a_read_of_every_line(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], cut: int, block: int
) -> None:
    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    cut = min(cut, len(data))
    path = tmp_path_factory.mktemp("usage") / "logs.txt"

    def every_line() -> dict[str, tuple[int, int]]:
        # As the daemon read them before it kept its place: every line, in text mode.
        with path.open(encoding="utf-8", errors="replace") as fh:
            return dispatched_keys(fh)

    with mock.patch.object(logscan, "BLOCK", block):
        path.write_bytes(data[:cut])
        assert dict(dispatched_in(path)) == every_line()
        with path.open("ab") as fh:
            fh.write(data[cut:])
        assert dict(dispatched_in(path)) == every_line()
    assert dispatched_in(path.parent / "missing.txt") == {}


def _dispatched(rollout: str, row: int) -> bytes:
    details = {"rollout_id": rollout, "row_index": row, "run_index": 0}
    return f"{TS} INFO [dispatch] dispatching rollout {json.dumps(details)}".encode()


def _write_live_usage(run: Path, rollouts: list[str]) -> None:
    usage = {"calls": 1, "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    doc = {
        "version": 1,
        "pid": os.getpid(),
        "in_flight": len(rollouts),
        "rollouts": {rid: usage for rid in rollouts},
        "totals": {},
        "done": False,
        "updated_at": TS,
    }
    (run / LIVE_USAGE_FILE).write_text(json.dumps(doc))


async def _shutdown(cancel: bool) -> None:
    raise AssertionError("not asked for")


def _info() -> dict[str, Any]:
    return {"version": "test", "pid": os.getpid(), "runs_active": []}


@needs_proc_io
async def test_usage_and_tail_of_a_large_log_read_only_what_was_added(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "configs" / "eval").mkdir(parents=True)
    run = make_run(workspace / ".osmosis" / "evals", "big", records=[ok(0)], total=10)
    _large_log(run / "logs.txt", [_dispatched(f"r{i}", i) for i in range(1, 4)])
    _write_live_usage(run, ["r1", "r3"])
    registry = Registry(workspace, nursery)
    # This process stands for the run's live child (adopted, as after a daemon restart), so
    # its usage_live.json counts.
    pid = os.getpid()
    token = start_token(pid)
    assert token is not None
    registry.runs_dir.mkdir(parents=True)
    ChildRecord("big", pid, token, TS, log_offset=0).save(registry.runs_dir)
    assert registry.adopt() == ["big"]
    app = ControlApp(registry, _info, _shutdown)
    sock = bind_tcp("127.0.0.1", 0)
    await nursery.start(serve, [(sock, app)])
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def keys(doc: dict[str, Any]) -> list[tuple[str, int]]:
        return [(r["rollout_id"], r["row_index"]) for r in doc["rollouts"]]

    with trio.fail_after(60):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            usage = (await client.get("/v1/runs/big/usage")).json()
            assert usage["live"] is True and keys(usage) == [("r1", 1), ("r3", 3)]
            logs = (await client.get("/v1/runs/big/logs?tail=1")).json()
            assert logs == {"first_line": 4, "lines": [_dispatched("r3", 3).decode()]}
            with (run / "logs.txt").open("ab") as fh:
                fh.write(b"".join(_dispatched(f"r{i}", i) + b"\n" for i in range(4, 1000)))
            _write_live_usage(run, ["r3", "r999"])
            start = _bytes_read()
            usage = (await client.get("/v1/runs/big/usage")).json()
            middle = _bytes_read()
            logs = (await client.get("/v1/runs/big/logs?tail=2")).json()
            end = _bytes_read()
    assert keys(usage) == [("r3", 3), ("r999", 999)]
    assert logs == {
        "first_line": 999,
        "lines": [_dispatched(f"r{i}", i).decode() for i in (998, 999)],
    }
    # Each call (its run view included) read what was added and the end, not the 200 MB.
    assert middle - start < FEW_BYTES and end - middle < FEW_BYTES, (middle - start, end - middle)
