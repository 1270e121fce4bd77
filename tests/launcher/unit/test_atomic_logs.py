"""Atomic writes and permissions (docs/spec/supervisor.md §3.1) and logs.txt (§3.8)."""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from launcher.redact import REDACTED, Redactor
from launcher.rundir.atomic import (
    atomic_copy_file,
    atomic_write_bytes,
    atomic_write_json,
    canonical_json,
    ensure_dir,
)
from launcher.rundir.logs import RunLog, utc_now_iso


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_write_creates_0600_files_and_0700_dirs(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "f.json"
    atomic_write_json(target, {"k": "é", "n": [1]})
    assert target.read_bytes() == b'{\n  "k": "\xc3\xa9",\n  "n": [\n    1\n  ]\n}\n'
    assert mode(target) == 0o600
    assert mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700
    atomic_write_bytes(target, b"new", durable=False)
    assert target.read_bytes() == b"new" and mode(target) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]  # no temp left behind


def test_atomic_write_failure_keeps_old_content_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(ValueError):
        atomic_write_json(target, {"x": float("nan")})
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_atomic_write_cleans_temp_on_replace_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: object) -> None:
        raise OSError("replace failed")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="replace failed"):
        atomic_write_bytes(tmp_path / "f", b"x")
    assert list(tmp_path.iterdir()) == []


def test_atomic_copy_refuses_symlink_source_and_keeps_mtime(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"data")
    os.utime(src, ns=(1_000_000_000, 2_000_000_000))
    dst = tmp_path / "out" / "dst.bin"
    atomic_copy_file(src, dst)
    assert dst.read_bytes() == b"data" and not dst.is_symlink() and mode(dst) == 0o600
    assert dst.stat().st_mtime_ns == 2_000_000_000
    link = tmp_path / "link"
    link.symlink_to(src)
    with pytest.raises(OSError):
        atomic_copy_file(link, tmp_path / "out" / "via-link")


def test_canonical_json() -> None:
    assert canonical_json({"b": 1, "a": "é", "c": None}) == '{"a":"é","b":1,"c":null}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("inf")})


def test_ensure_dir_is_idempotent(tmp_path: Path) -> None:
    ensure_dir(tmp_path / "x" / "y")
    ensure_dir(tmp_path / "x" / "y")
    assert (tmp_path / "x" / "y").is_dir()


def test_utc_timestamp_format() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", utc_now_iso())


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 8, 20, 12, 34, 56, 123456, tzinfo=UTC),
        datetime(2026, 8, 20, 12, 34, 56, 0, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
def test_one_formatter_keeps_each_files_timestamp_format(moment: datetime) -> None:
    # logs.txt, the manifest, metrics.json and server.json were written with strftime,
    # tunnel.json with isoformat(); the one formatter reproduces both exactly.
    assert utc_now_iso(moment) == moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    tunnel_format = moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    assert utc_now_iso(moment, timespec="auto") == tunnel_format


def test_log_lines_are_formatted_redacted_and_echoed(tmp_path: Path) -> None:
    path = tmp_path / "logs.txt"
    echoed: list[str] = []
    redactor = Redactor(["s3cret-value"])
    with RunLog(path, redactor, echo=echoed.append) as log:
        log.info("deps", "resolved s3cret-value ok")
        log.warning(
            "result", "work item finished", {"reward": None, "b": 1, "token": "s3cret-value"}
        )
        log.error("server", "line1\nline2")
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and mode(path) == 0o600
    ts = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
    assert re.fullmatch(ts + rf" INFO \[deps\] resolved {re.escape(REDACTED)} ok", lines[0])
    assert lines[1].endswith(
        'WARNING [result] work item finished {"b":1,"reward":null,"token":"' + REDACTED + '"}'
    )
    assert lines[2].endswith("ERROR [server] line1\\nline2")
    assert echoed == lines
    assert "s3cret-value" not in path.read_text()


def test_log_appends_across_opens(tmp_path: Path) -> None:
    path = tmp_path / "logs.txt"
    for i in range(2):
        log = RunLog(path, Redactor())
        log.info("run", f"open {i}")
        log.close()
        log.close()
    assert [line.split("] ")[1] for line in path.read_text().splitlines()] == ["open 0", "open 1"]


def test_log_details_never_crash_on_odd_values(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "logs.txt", Redactor())
    line = log.info("run", "odd", {"p": Path("/x"), "f": float("nan")})
    log.close()
    assert json.loads(line.split(" odd ", 1)[1].replace("NaN", "null"))["p"] == "PosixPath('/x')"


def test_log_survives_lone_surrogates(tmp_path: Path) -> None:
    with RunLog(tmp_path / "logs.txt", Redactor()) as log:
        log.info("rollout-server", "odd \udc80 byte")
    assert "odd \\udc80 byte" in (tmp_path / "logs.txt").read_text()
