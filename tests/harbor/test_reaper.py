"""Start-up reaping of what dead rollout servers left, and the staged task's overlays.

The first tests need no podman (scratch dirs, the owner file, which names count as a trial's).
The last one plants, with real podman, what a trial killed while its image was being built
leaves (a staged dir of a dead owner, its compose network, its built image's tag) and checks a
new backend removes exactly that: the base image and a live owner's trial stay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rollout_server.harbor import HarborBackend
from rollout_server.harbor.archive import retire_trial_dir
from rollout_server.harbor.containers import _leftover_argvs, owner_alive, owner_token
from rollout_server.harbor.reaper import reap_dead_owners
from rollout_server.harbor.staging import OWNER_FILE, stage_trial, stale_trials
from tests.harbor.conftest import EXAMPLE, IMAGE

TASK = EXAMPLE / "tasks" / "hello"


def _dead_owner() -> str:
    """The owner token of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    token = owner_token(child.pid)
    child.kill()
    child.wait()
    return token


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[0]


def test_a_zombie_owner_is_dead() -> None:
    # A rollout server killed with its supervisor may linger as a zombie (reparented to a PID 1
    # that does not reap); its trials' containers are orphans all the same.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    token = owner_token(child.pid)
    assert owner_alive(token)
    assert child.stdin is not None
    child.stdin.close()
    for _ in range(400):
        if _state(child.pid) == b"Z":
            break
        time.sleep(0.025)
    assert _state(child.pid) == b"Z", "the child never became a zombie"
    assert not owner_alive(token)
    assert owner_alive(owner_token())
    child.wait()
    assert not owner_alive(token)


def _plant(root: Path, rollout_id: str, owner: str | None) -> None:
    staging = root / "staging" / rollout_id
    staging.mkdir(parents=True)
    if owner is not None:
        (staging / OWNER_FILE).write_text(json.dumps({"owner": owner}))
    trial = root / "trials" / f"trial-{rollout_id}"
    trial.mkdir(parents=True)
    (trial / "trial.log").write_text("half a trial\n")


def test_only_dead_owners_trials_are_stale(tmp_path: Path) -> None:
    _plant(tmp_path, "dead", _dead_owner())
    _plant(tmp_path, "alive", owner_token())
    _plant(tmp_path, "unowned-new", None)
    _plant(tmp_path, "unowned-old", None)
    old = tmp_path / "staging" / "unowned-old"
    os.utime(old, (0, 0))
    (tmp_path / "trials" / "trial-kept").mkdir()  # kept on purpose: no staging dir
    assert stale_trials(tmp_path) == ["dead", "unowned-old"]


def test_reap_removes_the_scratch_of_dead_owners_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _plant(tmp_path, "dead", _dead_owner())
    _plant(tmp_path, "alive", owner_token())
    (tmp_path / "trials" / "trial-kept").mkdir()
    report = reap_dead_owners(None, tmp_path)
    assert report.trials == ["trial-dead"]
    assert not (tmp_path / "staging" / "dead").exists()
    assert not (tmp_path / "trials" / "trial-dead").exists()
    assert (tmp_path / "staging" / "alive").is_dir()
    assert (tmp_path / "trials" / "trial-alive").is_dir()
    assert (tmp_path / "trials" / "trial-kept").is_dir()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("harbor: reaped 0 orphaned container(s)")
    assert reap_dead_owners(None, tmp_path).empty
    assert capsys.readouterr().out == ""


def test_trial_dirs_no_trial_owns_are_removed_once_old(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _plant(tmp_path, "alive", owner_token())
    trials = tmp_path / "trials"
    # Written by a Harbor process that outlived its server (or kept by an older rollbridge).
    for name in ("trial-orphan", "trial-young", "trial-kept", "trial-alive"):
        (trials / name).mkdir(exist_ok=True)
        (trials / name / "result.json").write_text("{}")
    retire_trial_dir(trials / "trial-kept", True, [])  # kept on purpose: marked
    for name in ("trial-orphan", "trial-kept", "trial-alive"):
        os.utime(trials / name, (0, 0))
    report = reap_dead_owners(None, tmp_path)
    assert report.trial_dirs == ["trial-orphan"]
    assert sorted(p.name for p in trials.iterdir()) == ["trial-alive", "trial-kept", "trial-young"]
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("harbor: removed 1 Harbor trial dir(s) under ")
    assert reap_dead_owners(None, tmp_path).empty


def test_leftovers_are_matched_by_the_trials_compose_projects_only() -> None:
    networks = (
        b"podman\ntrial-ab__env_default\ntrial-ab__verifier__main_default\ntrial-abc__env_default\n"
    )
    images = b"localhost/local/bookworm-harbor:latest\nlocalhost/trial-ab__env_main:latest\n"
    assert _leftover_argvs("podman", ["trial-AB"], networks, images) == [
        [
            "podman",
            "network",
            "rm",
            "-f",
            "trial-ab__env_default",
            "trial-ab__verifier__main_default",
        ],
        ["podman", "rmi", "-f", "localhost/trial-ab__env_main:latest"],
    ]
    assert _leftover_argvs("podman", [], networks, images) == []


def test_a_container_a_killed_podman_run_left_in_storage_is_removed_by_name() -> None:
    # `podman ps --external`: such a container has no labels, only the name compose gave it.
    external = (
        b"0123456789ab trial-ab__env_main_1\n"
        b"ba9876543210 trial-abc__env_main_1\n"
        b"cafecafecafe someone-elses\n"
    )
    assert _leftover_argvs("podman", ["trial-ab"], b"", b"", b"", external) == [
        ["podman", "rm", "-f", "0123456789ab"]
    ]


def test_staged_task_gets_the_overlay_in_every_verifier_environment(tmp_path: Path) -> None:
    source = tmp_path / "task"
    (source / "environment").mkdir(parents=True)
    (source / "environment" / "Dockerfile").write_text("FROM x\n")
    (source / "tests").mkdir()
    (source / "tests" / "Dockerfile").write_text("FROM y\n")
    (source / "steps" / "one" / "tests").mkdir(parents=True)
    (source / "steps" / "one" / "tests" / "Dockerfile").write_text("FROM z\n")
    (source / "steps" / "one" / "tests" / "docker-compose.yaml").write_text("services: {}\n")
    (source / "task.toml").write_text("")
    service = {"init": True, "labels": {"k": "v"}}
    staged = stage_trial(
        tmp_path / "root", "r1", source, owner="1:2", instruction="hi\n", service=service
    )
    expected = {"services": {"main": service}}
    assert (
        json.loads((staged.task_dir / "environment" / "docker-compose.yaml").read_text())
        == expected
    )
    assert json.loads((staged.task_dir / "tests" / "docker-compose.yaml").read_text()) == expected
    # A task's own compose file is never replaced.
    assert (staged.task_dir / "steps" / "one" / "tests" / "docker-compose.yaml").read_text() == (
        "services: {}\n"
    )
    assert json.loads(staged.overlay.read_text()) == expected
    assert json.loads((staged.staging / OWNER_FILE).read_text()) == {
        "owner": "1:2",
        "trial": "trial-r1",
    }
    assert (staged.task_dir / "instruction.md").read_text() == "hi\n"
    assert not (source / "tests" / "docker-compose.yaml").exists()


def _podman(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["podman", *args], capture_output=True, timeout=60, check=False)


def _names(*args: str) -> list[str]:
    return _podman(*args).stdout.decode().split()


def test_a_trial_killed_before_its_container_existed_is_reaped(
    testbed: None, tmp_path: Path
) -> None:
    dead, alive = uuid.uuid4().hex, uuid.uuid4().hex
    _plant(tmp_path, dead, _dead_owner())
    _plant(tmp_path, alive, owner_token())
    planted = {
        dead: (f"trial-{dead}__env_default", f"localhost/trial-{dead}__env_main:latest"),
        alive: (f"trial-{alive}__env_default", f"localhost/trial-{alive}__env_main:latest"),
    }
    try:
        for network, image in planted.values():
            assert _podman("network", "create", network).returncode == 0
            assert _podman("tag", IMAGE, image).returncode == 0
        HarborBackend(TASK, trials_root=tmp_path)
        networks = _names("network", "ls", "--format", "{{.Name}}")
        images = _names("images", "--format", "{{.Repository}}:{{.Tag}}")
        assert planted[dead][0] not in networks
        assert planted[dead][1] not in images
        assert not (tmp_path / "staging" / dead).exists()
        assert not (tmp_path / "trials" / f"trial-{dead}").exists()
        # A live owner's trial and the base image the trial image shared are untouched.
        assert planted[alive][0] in networks
        assert planted[alive][1] in images
        assert f"localhost/{IMAGE}:latest" in images
    finally:
        for network, image in planted.values():
            _podman("network", "rm", "-f", network)
            _podman("rmi", image)
