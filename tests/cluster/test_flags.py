"""``--ray`` is checked before anything starts: Ray installed, and token auth for a cluster."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from launcher.cluster.flags import check_ray_flag, ray_temp_dir, this_machines_cluster
from launcher.errors import DependencyError, ValidationError

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="needs Ray (the rollbridge[ray] extra)"
)


@needs_ray
@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"RAY_AUTH_MODE": "token"},
        {"RAY_AUTH_TOKEN_PATH": "/t"},
    ],
)
def test_a_cluster_without_token_auth_is_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="needs Ray token authentication"):
        check_ray_flag("10.0.0.1:6379", environ)


@needs_ray
@pytest.mark.parametrize("mode", ["tokens", "bogus", "off"])
def test_a_mode_ray_does_not_know_is_named(mode: str) -> None:
    """Ray reads `token` and `disabled` (in any case): another value is the problem, said."""
    with pytest.raises(ValidationError, match=f"RAY_AUTH_MODE='{mode}' is not a mode Ray knows"):
        check_ray_flag("10.0.0.1:6379", {"RAY_AUTH_MODE": mode, "RAY_AUTH_TOKEN": "x"})
    check_ray_flag("10.0.0.1:6379", {"RAY_AUTH_MODE": "TOKEN", "RAY_AUTH_TOKEN": "x"})


@needs_ray
@pytest.mark.parametrize(
    ("address", "environ"),
    [
        ("10.0.0.1:6379", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/t"}),
        ("10.0.0.1:6379", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x"}),
        ("10.0.0.1:6379", {"RAY_AUTH_MODE": "disabled"}),
        ("local", {}),
    ],
)
def test_accepted(address: str, environ: dict[str, str]) -> None:
    check_ray_flag(address, environ)


def test_blank_address_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs a cluster address"):
        check_ray_flag(" ", {})


def test_without_ray_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DependencyError, match=r"rollbridge\[ray\]"):
        check_ray_flag("local", {})


def test_the_daemon_passes_shard_and_ray_to_the_run() -> None:
    from launcher.daemon.children import run_argv
    from launcher.daemon.registry import ApiError, parse_start

    request = parse_start({"config": "c.toml", "shard": "1/4", "ray": "10.0.0.1:6379"})
    argv = run_argv(request.config, "n", request.flags)
    assert argv[argv.index("--shard") + 1] == "1/4"
    assert argv[argv.index("--ray") + 1] == "10.0.0.1:6379"
    with pytest.raises(ApiError, match="shard must be of type str"):
        parse_start({"config": "c.toml", "shard": 1})


def test_ray_alone_is_ray_address_then_what_ray_start_wrote(tmp_path: Path) -> None:
    """``--ray`` without an address (``auto``) is this machine's cluster, found as Ray finds it."""
    env = {"RAY_TMPDIR": str(tmp_path)}
    with pytest.raises(ValidationError) as none:
        this_machines_cluster(env)
    assert str(none.value) == (
        "--ray without an address joins this machine's Ray cluster, and there is none: "
        f"RAY_ADDRESS is not set and `ray start` has not written {tmp_path}/ray/"
        "ray_current_cluster; pass --ray HOST:PORT, or --ray local for a cluster of the run's own"
    )
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.7:6379")
    assert this_machines_cluster(env) == "10.0.0.7:6379"
    assert this_machines_cluster({**env, "RAY_ADDRESS": "10.0.0.8:6380"}) == "10.0.0.8:6380"
    assert this_machines_cluster({**env, "RAY_ADDRESS": "auto"}) == "10.0.0.7:6379"
    with pytest.raises(ValidationError, match="uses RAY_ADDRESS, which must be HOST:PORT"):
        this_machines_cluster({**env, "RAY_ADDRESS": "ray://10.0.0.8:10001"})
    (tmp_path / "ray" / "ray_current_cluster").write_text("garbage")
    with pytest.raises(ValidationError, match="there is none"):
        this_machines_cluster(env)


def test_ray_temp_dir_follows_ray_s_rule() -> None:
    assert ray_temp_dir({"RAY_TMPDIR": "/a", "TMPDIR": "/b"}) == Path("/a/ray")
    assert ray_temp_dir({"TMPDIR": "/b"}) == Path("/b/ray")
    assert ray_temp_dir({}) == Path("/tmp/ray")
