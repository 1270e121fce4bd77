"""The use locks and pruning of the digest caches (rollout_server/harbor/cachekeep.py), on real
files with real ``flock``s: the most recently used entries stay, an entry held by a live process
stays until that process dies (``kill -9``), a holder that waited through a prune ends up on the
new lock, and a failed build leaves no lock behind."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from rollout_server.harbor import cachekeep
from rollout_server.harbor.cachekeep import hold, keep_count, prune


def _digest(n: int) -> str:
    return f"{n:064x}"


def _entry(root: Path, n: int, age_s: float, size: int = 10_000) -> str:
    """A cache entry ``n`` (a directory with a file) last used ``age_s`` ago."""
    name = _digest(n)
    (root / name / "sub").mkdir(parents=True)
    (root / name / "sub" / "data").write_bytes(b"x" * size)
    lock = root / f"{name}.lock"
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return name


def _names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def test_prune_keeps_the_most_recently_used_and_the_current(tmp_path: Path) -> None:
    names = [_entry(tmp_path, n, age_s=1000.0 * n) for n in range(1, 8)]  # 1 newest, 7 oldest
    current = names[-1]  # the oldest, but the caller's own: never removed, counted in keep
    pruned = prune(tmp_path, 3, current=current)
    assert pruned.entries == 4 and pruned.bytes >= 4 * 10_000
    kept = {current, names[0], names[1]}
    assert _names(tmp_path) == kept | {f"{n}.lock" for n in kept}


def test_without_a_current_entry_keep_counts_them_all(tmp_path: Path) -> None:
    names = [_entry(tmp_path, n, age_s=10.0 * n) for n in range(1, 4)]
    assert prune(tmp_path, 2).entries == 1
    assert not (tmp_path / names[2]).exists() and (tmp_path / names[1]).is_dir()


def test_hold_marks_the_entry_used_now(tmp_path: Path) -> None:
    old, new = _entry(tmp_path, 1, age_s=5000.0), _entry(tmp_path, 2, age_s=10.0)
    held = hold(tmp_path, old)
    held.release()  # used a moment ago: now the most recent
    assert prune(tmp_path, 1).entries == 1
    assert (tmp_path / old).is_dir() and not (tmp_path / new).exists()


_HOLDER = """
import sys, time
from pathlib import Path
from rollout_server.harbor.cachekeep import hold
held = hold(Path(sys.argv[1]), sys.argv[2])
print("held", flush=True)
time.sleep(600)
"""


async def test_an_entry_held_by_a_live_process_stays_until_it_dies(tmp_path: Path) -> None:
    old = _entry(tmp_path, 1, age_s=9000.0)
    new = _entry(tmp_path, 2, age_s=1.0)
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", _HOLDER, str(tmp_path), old], stdout=subprocess.PIPE
    )
    try:
        with trio.fail_after(30):
            assert holder.stdout is not None
            line = await holder.stdout.receive_some(100)
        assert line.strip() == b"held"
        assert prune(tmp_path, 1, current=new).entries == 0
        assert (tmp_path / old).is_dir()
    finally:
        holder.kill()  # SIGKILL: the kernel drops its flock
        with trio.fail_after(30):
            await holder.wait()
    assert prune(tmp_path, 1, current=new).entries == 1
    assert _names(tmp_path) == {new, f"{new}.lock"}


def _waiting_on(path: Path) -> bool:
    """Whether some lock request waits on the file ``path`` (``/proc/locks``: ``->`` lines)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as table:
        return any("->" in line and f":{inode} " in line for line in table)


async def test_a_holder_that_waited_through_a_prune_holds_the_new_lock(tmp_path: Path) -> None:
    """``hold`` blocks while a prune has the entry; once the prune unlinked the lock it must
    not keep the removed file's lock (a later prune could not see it)."""
    name = _entry(tmp_path, 1, age_s=9000.0)
    lock = tmp_path / f"{name}.lock"
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what prune holds while it removes the entry
    got: list[cachekeep.Hold] = []
    waiter = threading.Thread(target=lambda: got.append(hold(tmp_path, name)), daemon=True)
    waiter.start()
    with trio.fail_after(10):
        while not _waiting_on(lock):
            await trio.sleep(0.01)
    # The rest of the prune: the entry goes, then its lock file, then the lock.
    shutil.rmtree(tmp_path / name)
    lock.unlink()
    os.close(fd)
    await trio.to_thread.run_sync(waiter.join, 10)
    assert got, "hold did not return once the prune let go"
    assert got[0].path == lock and lock.exists(), "the holder kept the unlinked file's lock"
    probe = os.open(lock, os.O_RDWR)  # the new lock is really held: a prune cannot take it
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
    assert prune(tmp_path, 1).entries == 0 and lock.exists()
    got[0].release()


def test_stale_scratch_goes_and_fresh_scratch_stays(tmp_path: Path) -> None:
    stale, fresh = tmp_path / ".tmp-aaaa-1", tmp_path / ".trash-bbbb-2"
    for folder in (stale, fresh):
        (folder / "x").mkdir(parents=True)
    then = time.time() - cachekeep.SCRATCH_AGE_S - 60
    os.utime(stale, (then, then))
    prune(tmp_path, 5)
    assert not stale.exists() and fresh.exists()


def test_a_failed_build_leaves_no_lock_unless_another_holds_it(tmp_path: Path) -> None:
    name = _digest(7)
    first = hold(tmp_path, name)
    second = hold(tmp_path, name)  # another agent, waiting to build it after this one
    first.abandon(tmp_path / name)
    assert (tmp_path / f"{name}.lock").exists(), "a lock another process holds was removed"
    second.abandon(tmp_path / name)
    assert _names(tmp_path) == set()
    (tmp_path / name).mkdir()  # built after all: its lock stays with it
    third = hold(tmp_path, name)
    third.abandon(tmp_path / name)
    assert (tmp_path / f"{name}.lock").exists()


def test_locks_left_by_failed_builds_are_pruned_like_entries(tmp_path: Path) -> None:
    keep = _entry(tmp_path, 1, age_s=1.0)
    orphan = _digest(2)
    for suffix in (".lock", ".build"):
        (tmp_path / f"{orphan}{suffix}").touch()
        os.utime(tmp_path / f"{orphan}{suffix}", (1.0, 1.0))
    prune(tmp_path, 1, current=keep)
    assert _names(tmp_path) == {keep, f"{keep}.lock"}


@pytest.mark.parametrize(
    ("raw", "expected"), [("", 5), ("3", 3), (" 12 ", 12), ("0", 5), ("-1", 5), ("many", 5)]
)
def test_keep_count_takes_a_positive_integer_or_the_default(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: int
) -> None:
    monkeypatch.setenv("RB_TEST_KEEP", raw)
    assert keep_count("RB_TEST_KEEP", 5) == expected
