"""manifest.json, the manifest gate, --fresh archive, Changed: groups, source digest (docs/spec/supervisor.md §3.2, §4)."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from launcher.config import EvalConfig, ExperimentConfig, RunSpec
from launcher.dataset import select_rows
from launcher.digest import digest_files, source_digest
from launcher.errors import CLIError
from launcher.rundir.manifest import (
    archive_run_dir,
    build_inputs,
    build_provenance,
    changed_groups,
    manifest_gate,
    read_manifest,
)
from launcher.workspace import GitState, Workspace


def inputs(tmp_path: Path, **over: object) -> dict:
    data = tmp_path / "d.jsonl"
    data.write_text('{"user_prompt": "q", "ground_truth": "a"}\n' * 3)
    config = EvalConfig(
        path=tmp_path / "x.toml",
        experiment=ExperimentConfig("echo", "main.py", "openai/m", "d"),
        env={"Z": "1", "A": "2"},
        secrets_required=("TOK", "API"),
    )
    spec = RunSpec(n=2, agent_timeout_sec=10.0)
    result = build_inputs(config, spec, select_rows(data, rows="0,2"), "f" * 64, environ={})
    result.update(over)
    return result


def test_inputs_lock_shape(tmp_path: Path) -> None:
    got = inputs(tmp_path)
    assert got == {
        "model_path": "openai/m",
        "model": {"upstream_base_url": "https://api.openai.com/v1"},
        "dataset": {"sha256": got["dataset"]["sha256"], "selected_source_rows": "0,2"},
        "n": 2,
        "rollout": {"name": "echo", "entrypoint": "main.py", "source_digest": "f" * 64},
        "env": {"A": "2", "Z": "1"},
        "secret_names": ["API", "TOK"],
        "timeouts": {"agent_timeout_sec": 10.0, "grader_timeout_sec": None},
        "versions": {"rollout_protocol": "0.4", "dataset_normalization": 1, "state_schema": 1},
    }
    assert list(got["env"]) == ["A", "Z"]


def test_provenance_omits_none(tmp_path: Path) -> None:
    config = EvalConfig(
        path=tmp_path / "configs/eval/x.toml",
        experiment=ExperimentConfig("r", "e", "m", "d", branch="dev"),
        advanced={"k": 1},
    )
    ws = Workspace(root=tmp_path, config_path=tmp_path / "configs" / "eval" / "x.toml")
    prov = build_provenance(config, ws, GitState("abc", None, True), "0.1.0")
    assert prov == {
        "sdk_version": "0.1.0",
        "config_branch": "dev",
        "config_path": "configs/eval/x.toml",
        "advanced": {"k": 1},
        "git_head": "abc",
        "git_dirty": True,
    }


def test_changed_groups() -> None:
    old = {"a": 1, "b": {"x": 1}, "gone": 1}
    new = {"a": 1, "b": {"x": 2}, "added": 2}
    assert changed_groups(old, new) == ["added", "b", "gone"]
    assert changed_groups(old, dict(old)) == []


def test_gate_creates_then_reopens_then_refuses(tmp_path: Path) -> None:
    run_dir = tmp_path / "out" / "run1"
    first = manifest_gate(run_dir, "run1", inputs(tmp_path), {"sdk_version": "x"}, fresh=False)
    assert first.created and first.archived_to is None
    assert (run_dir / "rollout_trials").is_dir()
    raw = json.loads((run_dir / "manifest.json").read_text())
    assert list(raw) == [
        "schema_version",
        "local_run_id",
        "run_name",
        "created_at",
        "inputs",
        "provenance",
    ]
    assert len(raw["local_run_id"]) == 32 and raw["created_at"].endswith("Z")
    assert stat.S_IMODE((run_dir / "manifest.json").stat().st_mode) == 0o600
    before = (run_dir / "manifest.json").read_bytes()

    again = manifest_gate(run_dir, "run1", inputs(tmp_path), {"sdk_version": "other"}, fresh=False)
    assert not again.created and again.manifest.local_run_id == first.manifest.local_run_id
    assert (run_dir / "manifest.json").read_bytes() == before  # never rewritten on resume

    changed = inputs(tmp_path, n=3, model_path="openai/other")
    with pytest.raises(CLIError) as info:
        manifest_gate(run_dir, "run1", changed, {}, fresh=False)
    assert info.value.code == "CONFLICT"
    assert info.value.message == (
        "run 'run1' was created with different resolved inputs, so resuming it would mix versions "
        "inside one set of metrics. Changed: model_path, n. Restart under the same name with "
        "--fresh (the previous results are archived, never deleted)."
    )
    assert (run_dir / "manifest.json").read_bytes() == before


def test_fresh_archives_the_old_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run1"
    first = manifest_gate(run_dir, "run1", inputs(tmp_path), {}, fresh=False)
    (run_dir / "events.jsonl").write_text("old\n")
    second = manifest_gate(run_dir, "run1", inputs(tmp_path, n=5), {}, fresh=True)
    assert second.created and second.archived_to is not None
    assert second.archived_to.name.startswith("run1.archive-")
    assert (second.archived_to / "events.jsonl").read_text() == "old\n"
    assert (
        read_manifest(second.archived_to / "manifest.json").local_run_id
        == first.manifest.local_run_id
    )
    assert second.manifest.local_run_id != first.manifest.local_run_id
    assert not (run_dir / "events.jsonl").exists()


def test_fresh_without_manifest_archives_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run1"
    run_dir.mkdir()
    (run_dir / "stray.txt").write_text("x")
    outcome = manifest_gate(run_dir, "run1", inputs(tmp_path), {}, fresh=True)
    assert outcome.created and outcome.archived_to is None
    assert (run_dir / "stray.txt").exists()


def test_archive_names_are_unique(tmp_path: Path) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    names = []
    for _ in range(3):
        (tmp_path / "r").mkdir()
        names.append(archive_run_dir(tmp_path / "r", now).name)
    assert names == [
        "r.archive-20260102T030405Z",
        "r.archive-20260102T030405Z-1",
        "r.archive-20260102T030405Z-2",
    ]


def test_symlinked_run_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(CLIError, match="is a symbolic link; refusing to use it"):
        manifest_gate(tmp_path / "link", "link", {}, {}, fresh=False)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{nope", "is unreadable"),
        (
            '{"schema_version": 2, "inputs": {}}',
            "was written by state schema version 2; this SDK writes version 1. Start a new run with --fresh.",
        ),
        ('{"schema_version": 1, "inputs": []}', "inputs must be an object"),
    ],
)
def test_read_manifest_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(content)
    with pytest.raises(CLIError) as info:
        read_manifest(path)
    assert message in info.value.message


def make_rollout(root: Path) -> Path:
    files = {
        "main.py": "print(1)\n",
        "pyproject.toml": "[project]\n",
        ".env": "X=1\n",
        "pkg/mod.py": "x = 1\n",
        "uv.lock": "lock\n",
        ".venv/lib/site.py": "venv\n",
        "pkg/__pycache__/mod.cpython-311.pyc": "pyc\n",
        "my_pkg.egg-info/PKG-INFO": "info\n",
        "node_modules/a.js": "js\n",
        ".git/HEAD": "ref\n",
        "a-b": "dash\n",
        "a/b": "slash\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_digest_file_selection_and_order(tmp_path: Path) -> None:
    root = make_rollout(tmp_path / "r")
    listed = [p.as_posix() for p in digest_files(root)]
    assert listed == [".env", "a/b", "a-b", "main.py", "pkg/mod.py", "pyproject.toml"]


def test_digest_changes_only_with_covered_files(tmp_path: Path) -> None:
    root = make_rollout(tmp_path / "r")
    base = source_digest(root)
    assert len(base) == 64 and base == source_digest(root)
    (root / "uv.lock").write_text("changed\n")
    (root / ".venv" / "new.py").write_text("x")
    (root / "pkg" / "__pycache__" / "x.pyc").write_text("x")
    assert source_digest(root) == base
    (root / "pkg" / "mod.py").write_text("x = 2\n")
    assert source_digest(root) != base


def test_digest_is_not_fooled_by_moving_bytes_between_path_and_content(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "ab").write_text("c")
    b = tmp_path / "b"
    b.mkdir()
    (b / "a").write_text("bc")
    assert source_digest(a) != source_digest(b)


def test_digest_symlink_rules(tmp_path: Path) -> None:
    root = make_rollout(tmp_path / "r")
    (tmp_path / "outside.txt").write_text("target")
    (root / "file-link").symlink_to(tmp_path / "outside.txt")
    assert "file-link" in [p.as_posix() for p in digest_files(root)]
    (root / "broken").symlink_to(tmp_path / "missing")
    with pytest.raises(CLIError, match="rollout source contains a directory or broken symlink"):
        source_digest(root)
    (root / "broken").unlink()
    (root / "dir-link").symlink_to(tmp_path)
    with pytest.raises(CLIError, match="directory or broken symlink"):
        source_digest(root)


def test_digest_excludes_output_root_inside_rollout(tmp_path: Path) -> None:
    root = make_rollout(tmp_path / "r")
    base = source_digest(root, tmp_path / "elsewhere")
    out = root / "runs"
    (out / "x").mkdir(parents=True)
    (out / "x" / "events.jsonl").write_text("{}\n")
    assert source_digest(root, out) == base
    with pytest.raises(CLIError) as info:
        source_digest(root, root)
    assert info.value.message.startswith(
        f"--output must not be the rollout source directory {root.resolve()}"
    )
