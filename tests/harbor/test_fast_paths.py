"""The per-trial fast paths, without the sandbox test bed: the podman-compose shim's reading of
Harbor's ``exec`` (and everything it leaves to the real podman-compose), its installation, and
the staged ``task.toml`` naming a prebuilt task image."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from rollout_server.harbor import _compose_shim as shim
from rollout_server.harbor.fastexec import install_compose_shim
from rollout_server.harbor.taskimage import prebuildable, use_task_image

GLOBALS = ["--in-pod=false", "--project-name", "trial-x__env", "-f", "a.yaml", "-f", "b.json"]


def test_harbors_exec_becomes_what_podman_compose_would_run() -> None:
    args = [*GLOBALS, "exec", "-w", "/app", "-e", "A=1=2", "-e", "B", "-u", "root", "main"]
    args += ["bash", "-c", "echo -w hi"]
    assert shim._exec_argv(args) == (
        [
            "podman",
            "exec",
            "--interactive",
            "--user",
            "root",
            "--workdir",
            "/app",
            "--tty",
            "--env=A=1=2",
            "--env=B",
            "trial-x__env_main_1",
            "bash",
            "-c",
            "echo -w hi",
        ],
        "trial-x__env_main_1",
    )
    plain = shim._exec_argv([*GLOBALS, "exec", "-T", "main", "true"])
    assert plain is not None and "--tty" not in plain[0]


def test_everything_else_is_left_to_podman_compose() -> None:
    for args in (
        [*GLOBALS, "up", "-d"],
        [*GLOBALS, "down", "--rmi", "local"],
        [*GLOBALS, "exec", "--index", "2", "main", "true"],  # an option the shim does not know
        [*GLOBALS, "exec", "main"],  # no command
        ["--podman-path", "/x", *GLOBALS, "exec", "main", "true"],  # a global it does not know
        ["-f", "a.yaml", "exec", "main", "true"],  # no project name
    ):
        assert shim._exec_argv(args) is None, args


def test_installed_shim_hands_other_commands_to_the_real_podman_compose(tmp_path: Path) -> None:
    bin_dir = tmp_path / "harbor-bin"
    bin_dir.mkdir()
    real = bin_dir / "podman-compose"
    real.write_text('#!/bin/sh\necho "real $*"\n')
    real.chmod(0o755)
    directory = install_compose_shim(tmp_path / "root", bin_dir)
    assert directory is not None
    assert install_compose_shim(tmp_path / "root", bin_dir) == directory  # once per content
    installed = directory / "podman-compose"
    assert oct(installed.stat().st_mode & 0o777) == "0o700"
    assert installed.read_text().startswith(f"#!{sys.executable} -I\n")
    env = dict(os.environ, PATH=f"{directory}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["podman-compose", *GLOBALS, "up", "-d"], env=env, capture_output=True, timeout=30
    )
    assert done.stdout.decode().strip() == f"real {' '.join(GLOBALS)} up -d"
    copied = subprocess.run(
        ["podman-compose", *GLOBALS, "cp", "x", "main:/y"], env=env, capture_output=True, timeout=30
    )
    assert copied.returncode == 2 and b"invalid choice: 'cp'" in copied.stderr


def test_no_real_podman_compose_no_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert install_compose_shim(tmp_path / "root", tmp_path / "nothing") is None


TASK = """schema_version = "1.4"

[task]
name = "local/hello"

[environment]  # the sandbox
network_mode = "public"
build_timeout_sec = 120

[verifier]
timeout_sec = 60
"""


def _task(tmp_path: Path, toml: str) -> Path:
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM localhost/local/bookworm-harbor\n")
    (task / "task.toml").write_text(toml)
    return task


def test_the_staged_task_names_the_prebuilt_image(tmp_path: Path) -> None:
    task = _task(tmp_path, TASK)
    assert prebuildable(task)
    assert use_task_image(task, "rollbridge-task/task:0123456789abcdef")
    doc = tomllib.loads((task / "task.toml").read_text())
    assert doc["environment"] == {
        "docker_image": "rollbridge-task/task:0123456789abcdef",
        "network_mode": "public",
        "build_timeout_sec": 120,
    }
    assert doc["verifier"] == {"timeout_sec": 60}
    # A task without an [environment] table gets one.
    bare = _task(tmp_path / "bare", 'schema_version = "1.4"\n')
    assert use_task_image(bare, "rollbridge-task/bare:1")
    assert tomllib.loads((bare / "task.toml").read_text())["environment"] == {
        "docker_image": "rollbridge-task/bare:1"
    }


def test_tasks_harbor_must_build_itself_are_not_prebuilt(tmp_path: Path) -> None:
    named = _task(
        tmp_path / "a",
        TASK.replace("[environment]  # the sandbox", '[environment]\ndocker_image = "x"'),
    )
    assert not prebuildable(named)
    composed = _task(tmp_path / "b", TASK)
    (composed / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    assert not prebuildable(composed)
    broken = _task(tmp_path / "c", "not toml [")
    assert not prebuildable(broken)
    # An edit that would not read back as meant leaves the file alone.
    dotted = _task(tmp_path / "d", 'environment.network_mode = "public"\n')
    before = (dotted / "task.toml").read_text()
    assert not use_task_image(dotted, "rollbridge-task/d:1")
    assert (dotted / "task.toml").read_text() == before


FAKE_PODMAN = """#!/bin/sh
echo "podman $*" >> "$PODMAN_LOG"
[ "$1" = ps ] && [ -n "$PODMAN_PS" ] && echo "$PODMAN_PS"
exit 0
"""


def _shim_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """PATH with the installed shim first, then a fake podman (logging its calls) and a fake
    real podman-compose (echoing its arguments)."""
    bin_dir = tmp_path / "harbor-bin"
    bin_dir.mkdir(exist_ok=True)
    real = bin_dir / "podman-compose"
    real.write_text('#!/bin/sh\necho "real $*"\n')
    real.chmod(0o755)
    podman = bin_dir / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    directory = install_compose_shim(tmp_path / "root", bin_dir)
    assert directory is not None
    path = os.pathsep.join([str(directory), str(bin_dir), os.environ["PATH"]])
    return dict(os.environ, PATH=path, PODMAN_LOG=str(tmp_path / "podman.log"), **extra)


def _compose(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(["podman-compose", *GLOBALS, *args], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().strip()


FINAL_DOWN = ("down", "--rmi", "local", "--volumes", "--remove-orphans")


def test_a_trials_downs_are_left_to_the_server_only_when_it_took_the_teardown_over(
    tmp_path: Path,
) -> None:
    env = _shim_env(tmp_path)
    # Not handed over: both go to the real podman-compose, podman is not asked.
    assert _compose(env, *FINAL_DOWN) == f"real {' '.join(GLOBALS)} {' '.join(FINAL_DOWN)}"
    assert _compose(env, "down", "--remove-orphans").startswith("real ")
    assert not (tmp_path / "podman.log").exists()
    handed = dict(env, ROLLBRIDGE_HARBOR_DEFER_DOWN=str(os.getpid()))  # the live server's pid
    # The final down succeeds at once: the server removes the project afterwards.
    assert _compose(handed, *FINAL_DOWN) == ""
    assert not (tmp_path / "podman.log").exists()
    # The server is dead (a zombie not reaped yet, or gone): the trial tears itself down.
    with subprocess.Popen(["true"]) as dead:
        while not Path(f"/proc/{dead.pid}/stat").read_bytes().rpartition(b")")[2].startswith(b" Z"):
            time.sleep(0.01)
        zombie = dict(env, ROLLBRIDGE_HARBOR_DEFER_DOWN=str(dead.pid))
        assert _compose(zombie, *FINAL_DOWN).startswith("real ")
    gone = dict(env, ROLLBRIDGE_HARBOR_DEFER_DOWN=str(dead.pid))
    assert _compose(gone, *FINAL_DOWN).startswith("real ")
    assert _compose(dict(env, ROLLBRIDGE_HARBOR_DEFER_DOWN="yes"), *FINAL_DOWN).startswith("real ")
    # The down before `up` in a fresh project: one look for its containers, nothing to do.
    assert _compose(handed, "down", "--remove-orphans") == ""
    assert (tmp_path / "podman.log").read_text() == (
        "podman ps -a -q --filter label=io.podman.compose.project=trial-x__env\n"
    )
    # Something of the project is there: the real podman-compose removes it.
    stale = dict(handed, PODMAN_PS="0123abcd")
    assert _compose(stale, "down", "--remove-orphans").startswith("real ")
    # Any other down (Harbor's delete=False, a keep_containers stop) is never answered here.
    assert _compose(handed, "down").startswith("real ")
    assert _compose(handed, "down", "--rmi", "local").startswith("real ")


def test_an_upload_becomes_podman_cp_into_the_services_container(tmp_path: Path) -> None:
    assert shim._cp_argv([*GLOBALS, "cp", "/host/solution/.", "main:/solution"]) == (
        ["podman", "cp", "/host/solution/.", "trial-x__env_main_1:/solution"],
        "trial-x__env_main_1",
    )
    for args in (
        [*GLOBALS, "cp", "main:/logs/agent", "/host/agent"],  # a download
        [*GLOBALS, "cp", "relative/x", "main:/y"],
        [*GLOBALS, "cp", "/host/x", "main:relative"],
        [*GLOBALS, "cp", "-a", "/host/x", "main:/y"],
        [*GLOBALS, "cp", "/host/x", "ma$in:/y"],
        ["-f", "a.yaml", "cp", "/host/x", "main:/y"],  # no project name
    ):
        assert shim._cp_argv(args) is None, args
    env = _shim_env(tmp_path)
    upload = ["podman-compose", *GLOBALS, "cp", "/host/solution/.", "main:/solution"]
    assert subprocess.run(upload, env=env, timeout=30).returncode == 0
    assert (tmp_path / "podman.log").read_text().splitlines() == [
        "podman container exists trial-x__env_main_1",
        "podman cp /host/solution/. trial-x__env_main_1:/solution",
    ]
    # Turned off: it fails as podman-compose's would (Harbor then streams a tar).
    off = subprocess.run(
        upload, env=dict(env, ROLLBRIDGE_HARBOR_FAST_CP="0"), capture_output=True, timeout=30
    )
    assert off.returncode == 2 and b"invalid choice: 'cp'" in off.stderr
