"""rollbridge as an installable package: the wheel and sdist ``uv build`` makes from this
checkout carry every runtime file and pass ``twine check``; the version comes from one place;
and an installed wheel, with no checkout and no wheel file left, scaffolds and runs a workspace
(its rollout environment gets rollbridge from the supervisor's own wheel, launcher.selfwheel)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from launcher.selfwheel import KEEP, installed_differs, self_wheel, source_dir
from rollout_server.protocol import sdk_version

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "bridge", "rollout_server", "tunnel")
UV = Path(sys.executable).parent / "uv"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _build(out: Path, *kinds: str) -> list[Path]:
    # Offline first: the build backend is normally in uv's cache already.
    for extra in (["--offline"], []):
        done = subprocess.run(
            [UV, "build", *extra, *kinds, "--out-dir", out, REPO],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode == 0:
            break
    assert done.returncode == 0, done.stderr
    return sorted(p for p in out.iterdir() if p.suffix in (".whl", ".gz"))


def test_what_running_the_examples_makes_is_ignored() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    made = [
        f"{rollout.relative_to(REPO).as_posix()}/{name}"
        for rollout in sorted(REPO.glob("examples/*/rollouts/*"))
        for name in ("uv.lock", ".venv/pyvenv.cfg", ".osmosis/evals/x/results.jsonl")
    ]
    made += [f"{w.relative_to(REPO).as_posix()}/.osmosis/x" for w in REPO.glob("examples/*")]
    assert len(made) > 4
    checked = subprocess.run(
        ["git", "-C", REPO, "check-ignore", "--no-index", *made],
        capture_output=True,
        text=True,
    )
    assert sorted(set(made) - set(checked.stdout.split())) == []


def _tracked_package_files() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", REPO, "ls-files", "-co", "--exclude-standard", *PACKAGES],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return sorted(n for n in listed if "__pycache__" not in n and (REPO / n).is_file())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if not UV.is_file():
        pytest.skip("needs uv next to this interpreter (the cli extra)")
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to list the package's files")
    return _build(tmp_path_factory.mktemp("dist"))


def test_the_wheel_and_the_sdist_carry_every_runtime_file(built: list[Path]) -> None:
    wheel = next(p for p in built if p.suffix == ".whl")
    sdist = next(p for p in built if p.name.endswith(".tar.gz"))
    assert wheel.name == f"rollbridge-{VERSION}-py3-none-any.whl"
    expected = _tracked_package_files()
    # Templates, report assets, the relay and harness copied into sandboxes, py.typed, ...
    assert any(n.endswith("py.typed") for n in expected)
    assert any(n.startswith("launcher/templates/") for n in expected)
    assert any(n.startswith("rollout_server/harbor/agent_path/") for n in expected)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata_text = archive.read(f"rollbridge-{VERSION}.dist-info/METADATA").decode()
    assert [n for n in expected if n not in names] == []
    assert f"\nVersion: {VERSION}\n" in metadata_text
    # The license text the metadata names (Apache-2.0) travels in both distributions.
    assert f"rollbridge-{VERSION}.dist-info/licenses/LICENSE" in names
    with tarfile.open(sdist) as archive:
        members = {m.name.partition("/")[2] for m in archive.getmembers()}
    assert [n for n in expected if n not in members] == []
    assert {"pyproject.toml", "README.md", "LICENSE"} <= members
    # Only the packages: not the tests (they need the checkout's fixtures) nor a stray .env.
    top = {*PACKAGES, "pyproject.toml", "README.md", "LICENSE", ""}
    strays = {m.split("/")[0] for m in members} - top
    assert strays <= {"PKG-INFO", ".gitignore"}, strays


def test_twine_check_passes(built: list[Path]) -> None:
    if importlib.util.find_spec("twine") is None:
        pytest.skip("needs twine (the dev extra)")
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *built],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_one_version_everywhere() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.stdout == f"rollbridge {VERSION}\n"
    assert sdk_version() == VERSION


def test_the_self_wheel_is_made_once_and_tells_a_stale_install(tmp_path: Path) -> None:
    if not UV.is_file():
        pytest.skip("needs uv next to this interpreter (the cli extra)")
    folder = self_wheel(UV, cache_root=tmp_path / "cache")
    (wheel,) = folder.glob("rollbridge-*.whl")
    assert wheel.name == f"rollbridge-{VERSION}-py3-none-any.whl"
    assert self_wheel(UV, cache_root=tmp_path / "cache") == folder
    assert wheel.stat().st_mtime_ns == next(folder.glob("*.whl")).stat().st_mtime_ns
    # Old wheels are pruned: at most KEEP stay, the one just made among them.
    for i in range(KEEP + 2):
        (tmp_path / "cache" / f"old{i}").mkdir()
    shutil.rmtree(folder)
    assert self_wheel(UV, cache_root=tmp_path / "cache") == folder
    left = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert len(left) == KEEP and folder in left
    # A venv with this wheel's files installed does not differ; one with an older file does.
    site = tmp_path / "venv/lib/python3.11/site-packages"
    info = site / f"rollbridge-{VERSION}.dist-info"
    info.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read(f"rollbridge-{VERSION}.dist-info/RECORD").decode()
    (info / "RECORD").write_text(record)
    assert not installed_differs(folder, tmp_path / "venv")
    first = record.splitlines()[0].split(",")
    (info / "RECORD").write_text(record.replace(first[1], "sha256=old"))
    assert installed_differs(folder, tmp_path / "venv")
    # Another version is what the rollout's resolution took (from an index): kept.
    newer = info.rename(site / "rollbridge-99.0.dist-info")
    assert not installed_differs(folder, tmp_path / "venv")
    info = newer.rename(info)
    (info / "direct_url.json").write_text("{}")  # the rollout's own path source: not ours
    assert not installed_differs(folder, tmp_path / "venv")


def _scan_for(root: Path, needle: bytes) -> list[Path]:
    hits = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            if not path.is_symlink() and needle in path.read_bytes():
                hits.append(path)
    return hits


@pytest.mark.slow
def test_an_installed_wheel_runs_a_new_workspace_without_the_checkout(tmp_path: Path) -> None:
    if not UV.is_file():
        pytest.skip("needs uv next to this interpreter (the cli extra)")
    outside = tmp_path / "user"
    outside.mkdir()
    assert not outside.resolve().is_relative_to(REPO.resolve())
    (wheel,) = _build(tmp_path / "dist", "--wheel")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        XDG_CACHE_HOME=str(tmp_path / "cache"),  # a fresh self-wheel cache; uv keeps its own
        UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv")),
        UV_PYTHON_DOWNLOADS="never",
    )
    venv = outside / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run(
        [UV, "venv", "--python", base_python, venv], check=True, env=env, capture_output=True
    )
    install = subprocess.run(
        [UV, "pip", "install", "--python", venv / "bin/python", f"{wheel}[cli]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    wheel.unlink()  # as a pip cache or a download folder would lose it
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    script = (
        "set -e\n"
        "rollbridge init demo --rollout demo\n"
        "cd demo\n"
        "rollbridge eval run configs/eval/demo.toml --yes\n"
    )
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Evaluation run finished:" in result.stdout
    assert _scan_for(outside / "demo", str(REPO).encode()) == []
    lock = (outside / "demo/rollouts/demo/uv.lock").read_text()
    assert str(tmp_path / "cache" / "rollbridge" / "self-wheel") in lock


def _installed(site: Path, body: str, direct_url: dict[str, object] | None = None) -> Path:
    """A rollbridge "installed" under ``site`` as pip leaves one: its files and dist-info."""
    package = site / "rollout_server"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(body)
    info = site / f"rollbridge-{VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rollbridge\nVersion: {VERSION}\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    record = f"rollout_server/__init__.py,sha256=x,{len(body)}\n{info.name}/RECORD,,\n"
    (info / "RECORD").write_text(record)
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return info


def _wheel_text(folder: Path) -> str:
    (wheel,) = folder.glob("rollbridge-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.read("rollout_server/__init__.py").decode()


def test_the_self_wheel_is_the_installed_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed from a checkout without ``-e``, what runs is the installed copy: the wheel is
    repacked from it (not built from the checkout, edited since); a file patched in place
    makes a new wheel; an unwritable cache falls back to a private temporary one."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    site = tmp_path / "site"
    info = _installed(
        site, "INSTALLED = 1\n", {"url": checkout.as_uri(), "dir_info": {"editable": False}}
    )
    monkeypatch.setattr(
        "launcher.selfwheel.metadata.distribution",
        lambda name: importlib.metadata.PathDistribution(info),
    )
    cache = tmp_path / "cache"
    first = self_wheel(UV, cache_root=cache)
    assert _wheel_text(first) == "INSTALLED = 1\n"
    (site / "rollout_server/__init__.py").write_text("INSTALLED = 2  # patched\n")
    second = self_wheel(UV, cache_root=cache)
    assert second != first and _wheel_text(second) == "INSTALLED = 2  # patched\n"
    # An unwritable cache (here a file where its directory would be) is not the end.
    (tmp_path / "xdg").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    fallback = self_wheel(UV)
    assert fallback.parent == tmp_path / "tmp" / f"rollbridge-self-wheel-{os.getuid()}"
    assert _wheel_text(fallback) == "INSTALLED = 2  # patched\n"


def test_an_editable_install_builds_from_its_checkout_and_a_wheelhouse_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    editable = _installed(
        tmp_path / "a", "", {"url": checkout.as_uri(), "dir_info": {"editable": True}}
    )
    plain = _installed(tmp_path / "b", "", {"url": checkout.as_uri(), "dir_info": {}})
    assert source_dir(importlib.metadata.PathDistribution(editable)) == checkout
    assert source_dir(importlib.metadata.PathDistribution(plain)) is None
    # uv runs in the rollout's directory: a relative wheelhouse must not be read from there.
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / f"rollbridge-{VERSION}-py3-none-any.whl").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROLLBRIDGE_WHEELHOUSE", "wh")
    assert self_wheel(UV) == tmp_path / "wh"
