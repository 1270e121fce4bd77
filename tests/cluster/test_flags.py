"""``--ray`` is checked before anything starts: Ray installed, and token auth for a cluster."""

from __future__ import annotations

import importlib.util

import pytest

from launcher.cluster.flags import check_ray_flag
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
        {"RAY_AUTH_MODE": "tokens", "RAY_AUTH_TOKEN": "x"},
    ],
)
def test_a_cluster_without_token_auth_is_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="needs Ray token authentication"):
        check_ray_flag("10.0.0.1:6379", environ)


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
