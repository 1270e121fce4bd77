"""The eval config's ``[ray]`` section and the ``--ray`` flags: what is accepted, the one line a
bad value gets, and flags winning over the config (launcher.config_ray)."""

from __future__ import annotations

import importlib.util
import io
import shutil
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.config import load_eval_config
from launcher.config_ray import DEFAULT_RESOURCE, RayConfig, RaySettings, resolve_ray
from launcher.errors import ValidationError
from launcher.prepare import EvalOptions, prepare
from launcher.ui import UI

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "workspace"
CONFIG = "configs/eval/echo.toml"


def _config(tmp_path: Path, ray: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(
        '[experiment]\nrollout = "echo"\nentrypoint = "main.py"\nmodel_path = "rollbridge/echo"\n'
        f'dataset = "echo"\n\n[secrets]\nrequired = []\n\n{ray}\n'
    )
    return path


def test_the_section_is_read(tmp_path: Path) -> None:
    text = '[ray]\naddress = "10.0.0.1:6379"\nmin_replicas = 2\nresource = "gpu_host"'
    config = load_eval_config(_config(tmp_path, text))
    assert config.ray == RayConfig("10.0.0.1:6379", 2, "gpu_host")
    assert load_eval_config(_config(tmp_path, "")).ray is None
    assert load_eval_config(_config(tmp_path, "[ray]")).ray == RayConfig()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('address = "10.0.0.1"', "ray.address in .* must be a Ray cluster address HOST:PORT"),
        ('address = "10.0.0.1:99999"', "must be a Ray cluster address HOST:PORT"),
        ('address = "ray://x:10001"', "must be a Ray cluster address HOST:PORT"),
        ("address = 6379", "ray.address must be a string"),
        ("min_replicas = 0", "ray.min_replicas in .* must be from 1 to 10000, got 0"),
        ("min_replicas = 2.0", "ray.min_replicas in .* must be an integer >= 1, got 2.0"),
        ("min_replicas = true", "must be an integer >= 1, got True"),
        ('resource = "CPU"', "ray.resource in .* must name a custom Ray resource"),
        ('resource = "a b"', "must name a custom Ray resource"),
        ('adress = "local"', r"Unrecognized key\(s\) in \[ray\] of .*: adress \(known: address"),
    ],
)
def test_bad_values_get_one_line(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ValidationError, match=expected) as exc:
        load_eval_config(_config(tmp_path, f"[ray]\n{text}"))
    assert "\n" not in exc.value.message


def test_ray_must_be_a_table(tmp_path: Path) -> None:
    path = _config(tmp_path, "")
    path.write_text('ray = "local"\n' + path.read_text())
    with pytest.raises(ValidationError, match=r"\[ray\] must be a table"):
        load_eval_config(path)


def test_flags_win_over_the_config() -> None:
    section = RayConfig("10.0.0.1:6379", 3, "gpu_host")
    assert resolve_ray(None, None, None) is None
    assert resolve_ray(RayConfig(min_replicas=2), None, None) is None  # no address: no Ray
    assert resolve_ray(section, None, None) == RaySettings("10.0.0.1:6379", 3, "gpu_host")
    assert resolve_ray(section, "local", 1) == RaySettings("local", 1, "gpu_host")
    assert resolve_ray(section, "h.example:6379", 2) == RaySettings("h.example:6379", 2, "gpu_host")
    assert resolve_ray(None, "h.example:6379", None) == RaySettings(
        "h.example:6379", 1, DEFAULT_RESOURCE
    )
    assert resolve_ray(RayConfig(min_replicas=2), "h:1", None) == RaySettings("h:1", 2)


@pytest.mark.parametrize(
    ("address", "minimum", "expected"),
    [
        (None, 2, "--ray-min-replicas needs --ray ADDRESS"),
        ("local", 0, "--ray-min-replicas must be from 1 to 10000, got 0"),
        ("nohost", None, "--ray must be a Ray cluster address HOST:PORT"),
        (" ", None, "--ray needs a cluster address"),
    ],
)
def test_bad_flags(address: str | None, minimum: int | None, expected: str) -> None:
    with pytest.raises(ValidationError, match=expected):
        resolve_ray(None, address, minimum)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(
        EXAMPLE, root, ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__")
    )
    monkeypatch.chdir(root)
    return root


@pytest.mark.parametrize(
    ("args", "config_ray", "expected"),
    [
        (["--ray-min-replicas", "0", "--ray", "local"], "", "--ray-min-replicas must be from 1"),
        (["--ray-min-replicas", "2"], "", "--ray-min-replicas needs --ray ADDRESS"),
        (["--ray", "10.0.0.1"], "", "--ray must be a Ray cluster address HOST:PORT"),
        ([], '[ray]\naddress = "nohost"', "ray.address in "),
        ([], "[ray]\nmin_replicas = -1", "ray.min_replicas in "),
        (
            ["--ray", "local", "--ray-min-replicas", "2"],
            "",
            "--ray-min-replicas 2 can never be met by --ray local",
        ),
        ([], '[ray]\naddress = "local"\nmin_replicas = 3', "[ray] min_replicas 3 can never"),
    ],
)
def test_the_cli_says_one_line_and_exits_non_zero(
    ws: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    config_ray: str,
    expected: str,
) -> None:
    if config_ray:
        config = ws / CONFIG
        config.write_text(config.read_text() + f"\n{config_ray}\n")
    with pytest.raises(SystemExit) as exc:
        main(["eval", "run", CONFIG, "--yes", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], err
    assert not (ws / ".osmosis" / "evals").exists()


@pytest.mark.parametrize(
    ("ray", "title"),
    [
        (None, "Local Evaluation"),
        ("10.0.0.1:6379", "Evaluation on Ray (10.0.0.1:6379)"),
        ("local", "Evaluation on Ray (local)"),
    ],
)
def test_the_plan_table_says_where_the_rollouts_run(
    ws: Path, monkeypatch: pytest.MonkeyPatch, ray: str | None, title: str
) -> None:
    if ray is not None and importlib.util.find_spec("ray") is None:
        pytest.skip("--ray needs Ray installed (rollbridge[ray])")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token for a cluster never joined
    out = io.StringIO()
    prepare(EvalOptions(config=CONFIG, ray=ray), UI("rich", stdout=out, stderr=io.StringIO()))
    assert out.getvalue().splitlines()[0] == title
