"""A remote trial directory packed by the node agent and unpacked by the supervisor."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from launcher.cluster.trial import (
    UnsafeEntry,
    _relative,
    is_small,
    pack_trial,
    packed_size,
    trial_tar,
    unpack_trial,
)


def _trial(root: Path) -> Path:
    source = root / "src"
    (source / "artifacts" / "empty").mkdir(parents=True)
    (source / "trajectory.json").write_text("{}")
    (source / "artifacts" / "a.txt").write_text("a")
    (source / "artifacts" / "run.sh").write_text("#!/bin/sh\n")
    (source / "artifacts" / "run.sh").chmod(0o777)
    (source / "trajectory.json").chmod(0o600)
    (source / "artifacts").chmod(0o700)
    source.chmod(0o700)
    return source


def test_files_and_directories_travel_as_entries(tmp_path: Path) -> None:
    packed = pack_trial(_trial(tmp_path))
    assert isinstance(packed, list) and is_small(packed)
    assert packed_size(packed) == len("{}") + len("a") + len("#!/bin/sh\n")
    assert len(packed) == 6  # the trial itself, 2 directories and 3 files
    unpack_trial(packed, tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "trajectory.json").read_text() == "{}"
    assert (out / "artifacts" / "a.txt").read_text() == "a"
    assert (out / "artifacts" / "empty").is_dir()
    # A private trial stays private (as a local run writes it), executable stays executable,
    # group/other write is dropped.
    assert (out / "artifacts" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "trajectory.json").stat().st_mode & 0o777 == 0o600
    assert (out / "artifacts").stat().st_mode & 0o777 == 0o700
    assert out.stat().st_mode & 0o777 == 0o700
    assert not (tmp_path / ".out.unpack").exists()


def test_an_unpack_replaces_an_older_copy(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "stale.txt").write_text("old")
    unpack_trial(pack_trial(_trial(tmp_path)), tmp_path / "out")
    assert not (tmp_path / "out" / "stale.txt").exists()
    assert (tmp_path / "out" / "trajectory.json").exists()


def test_a_symlink_makes_it_a_tar(tmp_path: Path) -> None:
    source = _trial(tmp_path)
    os.symlink("trajectory.json", source / "link.json")
    packed = pack_trial(source)
    assert isinstance(packed, bytes) and packed and not is_small(packed)
    unpack_trial(packed, tmp_path / "out")
    assert (tmp_path / "out" / "link.json").read_text() == "{}"
    assert (tmp_path / "out" / "artifacts" / "a.txt").read_text() == "a"


def test_no_trial_directory_packs_to_nothing(tmp_path: Path) -> None:
    assert pack_trial(tmp_path / "missing") == b"" == trial_tar(tmp_path / "missing")
    unpack_trial(b"", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_large_trials_are_not_small(tmp_path: Path) -> None:
    assert not is_small([("big.bin", 0o644, b"x" * (1 << 20))])
    assert not is_small([(f"f{n}", 0o644, b"") for n in range(100)])


@pytest.mark.parametrize("name", ["../escape", "/tmp/escape", "a/../../escape", ""])
def test_entries_outside_the_trial_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeEntry):
        unpack_trial([("ok.txt", 0o644, b"x"), (name, 0o644, b"x")], tmp_path / "bad")
    assert not (tmp_path / "escape").exists() and not (tmp_path / "bad").exists()
    assert not (tmp_path / ".bad.unpack").exists()


def test_a_tar_member_outside_the_trial_is_left_out(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    skipped = unpack_trial(buffer.getvalue(), tmp_path / "bad")
    assert [name for name, _ in skipped] == ["../escape"]
    assert not (tmp_path / "escape").exists() and (tmp_path / "bad").is_dir()


def test_unsafe_artifacts_of_a_remote_trial_are_left_out_not_fatal(tmp_path: Path) -> None:
    """A workflow on another node may leave a link to /etc/passwd, a link out of its trial or
    a fifo in its artifacts: each is left out (and named, for the log), the rest of the trial
    arrives, the trial is the owner's alone (0700), and no temporary directory stays."""
    source = _trial(tmp_path)
    os.symlink("/etc/passwd", source / "artifacts" / "passwd_link")
    os.symlink("../../../outside", source / "artifacts" / "up")
    os.symlink("a.txt", source / "artifacts" / "inside")
    os.mkfifo(source / "artifacts" / "fifo")
    skipped = unpack_trial(pack_trial(source), tmp_path / "out")
    names = sorted(PurePosixPath(name).name for name, _ in skipped)
    assert names == ["fifo", "passwd_link", "up"]
    assert all(reason for _, reason in skipped)
    out = tmp_path / "out"
    assert (out / "artifacts" / "a.txt").read_text() == "a"
    assert (out / "artifacts" / "inside").read_text() == "a"  # a link within the trial
    assert not (out / "artifacts" / "passwd_link").exists()
    assert out.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", source.name]


def test_a_failed_unpack_leaves_nothing_and_parents_are_made(tmp_path: Path) -> None:
    # The same file twice: the second creation fails (O_EXCL); what was written is removed.
    twice = [(".", 0o700, None), ("a.txt", 0o644, b"1"), ("a.txt", 0o644, b"2")]
    with pytest.raises(FileExistsError):
        unpack_trial(twice, tmp_path / "bad")
    assert os.listdir(tmp_path) == []
    # A file whose directories are not listed (a packer other than pack_trial): made 0700.
    unpack_trial([("deep/er/b.txt", 0o644, b"b")], tmp_path / "out")
    assert (tmp_path / "out" / "deep" / "er" / "b.txt").read_bytes() == b"b"
    assert (tmp_path / "out" / "deep").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "name", ["a", "a/b", "./a", "a/./b", "a//b", "a/b/", ".", "artifacts/x.json", ".hidden"]
)
def test_entry_names_split_as_pathlib_splits_them(name: str) -> None:
    # The unpack splits names by hand (no PurePosixPath per entry): the same parts.
    assert _relative(name) == PurePosixPath(name).parts
