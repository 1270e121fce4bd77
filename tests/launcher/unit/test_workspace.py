"""Workspace resolution, rollout path checks, dataset location, git provenance."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.config import EvalConfig, ExperimentConfig
from launcher.errors import CLIError
from launcher.workspace import (
    GitState,
    check_entrypoint_exists,
    check_rollout_paths,
    provenance_warnings,
    read_git_state,
    resolve_dataset_source,
    resolve_output_root,
    resolve_workspace,
)


def make_ws(root: Path) -> Path:
    for d in ("rollouts/echo", "configs/eval/sub", "configs/training", "data"):
        (root / d).mkdir(parents=True, exist_ok=True)
    config = root / "configs" / "eval" / "sub" / "x.toml"
    config.write_text("")
    return config


def test_workspace_is_found_from_a_relative_config_path(tmp_path: Path) -> None:
    make_ws(tmp_path)
    ws = resolve_workspace(Path("configs/eval/sub/x.toml"), tmp_path)
    assert ws.root == tmp_path.resolve()
    assert ws.config_relpath == "configs/eval/sub/x.toml"
    assert ws.default_output_root == tmp_path.resolve() / ".osmosis" / "evals"
    assert resolve_output_root(ws, None, tmp_path) == ws.default_output_root
    assert resolve_output_root(ws, "out", tmp_path / "data") == tmp_path.resolve() / "data" / "out"


def test_config_outside_configs_eval_or_not_toml(tmp_path: Path) -> None:
    make_ws(tmp_path)
    (tmp_path / "x.toml").write_text("")
    with pytest.raises(CLIError, match="must live under <workspace>/configs/eval/"):
        resolve_workspace(tmp_path / "x.toml", tmp_path)
    with pytest.raises(CLIError, match=r"must be a \.toml file"):
        resolve_workspace(tmp_path / "configs" / "eval" / "x.yaml", tmp_path)


def test_missing_workspace_directories_are_named(tmp_path: Path) -> None:
    config = make_ws(tmp_path)
    (tmp_path / "data").rmdir()
    (tmp_path / "rollouts" / "echo").rmdir()
    (tmp_path / "rollouts").rmdir()
    (tmp_path / "configs" / "training").rmdir()  # not needed for a local eval
    with pytest.raises(CLIError) as info:
        resolve_workspace(config, tmp_path)
    assert "missing rollouts/, data/;" in info.value.message


@pytest.mark.parametrize(
    ("rollout", "entrypoint", "message"),
    [
        ("/abs", "main.py", "Evaluation rollout must be a logical rollout name."),
        ("", "main.py", "Evaluation rollout '' is not a valid rollout name."),
        ("..", "main.py", "Evaluation rollout '..' is not a valid rollout name."),
        (
            "a/b",
            "main.py",
            "Evaluation rollout 'a/b' must be a single-segment name (no path separators).",
        ),
        (
            "a\\b",
            "main.py",
            "Evaluation rollout 'a\\b' must be a single-segment name (no path separators).",
        ),
        (
            "echo",
            "../other/main.py",
            "Evaluation entrypoint must resolve under rollouts/echo/ within the current workspace directory.",
        ),
        (
            "echo",
            "/etc/passwd",
            "Evaluation entrypoint must resolve under rollouts/echo/ within the current workspace directory.",
        ),
    ],
)
def test_rollout_path_checks(tmp_path: Path, rollout: str, entrypoint: str, message: str) -> None:
    ws = resolve_workspace(make_ws(tmp_path), tmp_path)
    with pytest.raises(CLIError) as info:
        check_rollout_paths(ws, rollout, entrypoint)
    assert info.value.message == message


def test_entrypoint_existence_is_checked_separately(tmp_path: Path) -> None:
    ws = resolve_workspace(make_ws(tmp_path), tmp_path)
    paths = check_rollout_paths(ws, "echo", "pkg/main.py")
    assert paths.entrypoint == tmp_path.resolve() / "rollouts" / "echo" / "pkg" / "main.py"
    with pytest.raises(CLIError) as info:
        check_entrypoint_exists(paths)
    assert info.value.message == (
        f"rollout entrypoint {paths.entrypoint} does not exist; "
        "check experiment.rollout and experiment.entrypoint"
    )
    paths.entrypoint.parent.mkdir()
    paths.entrypoint.write_text("")
    check_entrypoint_exists(paths)


def test_dataset_lookup_in_data_dir(tmp_path: Path) -> None:
    ws = resolve_workspace(make_ws(tmp_path), tmp_path)
    (tmp_path / "data" / "tiny.csv").write_text("a\n")
    src = resolve_dataset_source(ws, "tiny", None, tmp_path)
    assert (src.name, src.source, src.extension) == ("tiny.csv", "workspace", "csv")
    (tmp_path / "data" / "tiny.jsonl").write_text("{}\n")
    assert resolve_dataset_source(ws, "tiny", None, tmp_path).name == "tiny.jsonl"
    assert resolve_dataset_source(ws, "tiny.csv", None, tmp_path).name == "tiny.csv"
    with pytest.raises(CLIError, match="dataset 'nope' not found"):
        resolve_dataset_source(ws, "nope", None, tmp_path)
    # A name with its extension is looked for as given, never as `qa2.jsonl.jsonl`.
    (tmp_path / "data" / "qa2.jsonl.jsonl").write_text("{}\n")
    with pytest.raises(CLIError) as missing:
        resolve_dataset_source(ws, "qa2.jsonl", None, tmp_path)
    assert missing.value.message == (
        f"dataset 'qa2.jsonl' not found in {(tmp_path / 'data').resolve()}; add the file there "
        "or pass --dataset-file"
    )
    with pytest.raises(CLIError, match="must name a file inside"):
        resolve_dataset_source(ws, "../configs/eval/sub/x.toml", None, tmp_path)
    (tmp_path / "data" / "odd.txt").write_text("")
    with pytest.raises(CLIError) as info:
        resolve_dataset_source(ws, "odd.txt", None, tmp_path)
    assert info.value.message.endswith(
        "has extension 'txt' ; expected one of ['csv', 'jsonl', 'parquet']"
    )


def test_explicit_dataset_file(tmp_path: Path) -> None:
    ws = resolve_workspace(make_ws(tmp_path), tmp_path)
    (tmp_path / "elsewhere.jsonl").write_text("{}\n")
    src = resolve_dataset_source(ws, "ignored", "elsewhere.jsonl", tmp_path)
    assert (src.source, src.name) == ("explicit", "elsewhere.jsonl")
    with pytest.raises(CLIError) as info:
        resolve_dataset_source(ws, "ignored", "missing.jsonl", tmp_path)
    assert info.value.message == "--dataset-file missing.jsonl is not a file"
    (tmp_path / "NOEXT").write_text("")
    with pytest.raises(CLIError, match=r"has extension '\(none\)'"):
        resolve_dataset_source(ws, "ignored", "NOEXT", tmp_path)


def cfg(branch: str | None = None, commit: str | None = None) -> EvalConfig:
    return EvalConfig(
        path=Path("x"), experiment=ExperimentConfig("r", "e", "m", "d", branch, commit)
    )


def test_provenance_warnings() -> None:
    git = GitState(head="abcdef1234567890", branch="main", dirty=False)
    assert provenance_warnings(cfg(), git) == []
    assert provenance_warnings(cfg(commit="abcdef1"), git) == []
    assert provenance_warnings(cfg(branch="main"), git) == []
    assert provenance_warnings(cfg(commit="1234567"), git) == [
        "config pins commit 1234567 but the workspace is at abcdef1234567890; "
        "the local run executes the workspace as it is."
    ]
    assert provenance_warnings(cfg(branch="dev"), git) == [
        "config names branch 'dev' but the workspace is on 'main'; "
        "the local run executes the workspace as it is."
    ]
    assert provenance_warnings(cfg(branch="dev"), None) == []


def test_read_git_state(tmp_path: Path) -> None:
    assert read_git_state(tmp_path) is None
    env_cmd = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*env_cmd, "init", "-q", "-b", "work"], check=True)
    (tmp_path / "f").write_text("1")
    subprocess.run([*env_cmd, "add", "f"], check=True)
    subprocess.run([*env_cmd, "commit", "-q", "-m", "m"], check=True)
    state = read_git_state(tmp_path)
    assert state is not None and state.branch == "work" and state.dirty is False
    assert len(state.head) == 40
    (tmp_path / "f").write_text("2")
    state = read_git_state(tmp_path)
    assert state is not None and state.dirty is True
