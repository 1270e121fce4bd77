"""The sandbox bundle and image: real uv on a real rollout venv, real ``podman build``.

One small rollout project (``main.py`` + a helper module, depending on a copy of this
repository's SDK through an editable path source, like the example rollouts) is synced once for
the module. Its
bundle must hold the rollout's own wheel, an SDK wheel built from this checkout and the venv's
other distributions repacked byte for byte; a second call must find it without building; the
image built from it with the network off must import the SDK and the rollout's ``main`` with the
network off too. The image tests skip (with the reason) where podman cannot run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from rollout_server.harbor.bundle import Bundle, BundleError, build_bundle
from rollout_server.harbor.cachekeep import hold
from rollout_server.harbor.image import (
    SANDBOX_LABEL,
    SandboxImage,
    ensure_image,
    trial_dockerfile,
)
from rollout_server.harbor.wheelhouse import wheel_is_pure
from tests.harbor.conftest import EXAMPLE
from tests.launcher.e2e.helpers import REPO, UV, base_env

MAIN = '''"""A rollout's entry module (imported in the sandbox as ``main``)."""
from helpers.words import shout

WORKFLOW = shout("ok")
'''
TASK_ENV = EXAMPLE / "tasks" / "hello" / "environment"


def _copy_sdk(dest: Path) -> Path:
    """This checkout's distribution, copied (so edits elsewhere in the tree change nothing)."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for package in ("launcher", "bridge", "rollout_server", "tunnel"):
        shutil.copytree(
            REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return dest


def _write_project(root: Path, sdk: Path) -> Path:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        "[project]\n"
        'name = "Bundle_Probe.Rollout"\n'
        'version = "0.3.0"\n'
        'requires-python = ">=3.11"\n'
        'dependencies = ["rollbridge"]\n\n'
        "[tool.uv]\npackage = false\n\n"
        f'[tool.uv.sources]\nrollbridge = {{ path = "{sdk}", editable = true }}\n'
    )
    (root / "main.py").write_text(MAIN)
    (root / "helpers").mkdir()
    (root / "helpers" / "__init__.py").write_text("")
    (root / "helpers" / "words.py").write_text("def shout(s):\n    return s.upper()\n")
    (root / "data.json").write_text('{"k": 1}\n')
    # Never bundled: secrets, byte code, build outputs.
    (root / ".env").write_text("OPENAI_API_KEY=sk-never-in-a-bundle\n")
    (root / "helpers" / "__pycache__").mkdir()
    (root / "helpers" / "__pycache__" / "words.cpython-311.pyc").write_bytes(b"\0")
    (root / "build").mkdir()
    (root / "build" / "junk.txt").write_text("x")
    return root


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(project dir, venv interpreter) of a synced rollout environment."""
    root = tmp_path_factory.mktemp("bundle-rollout")
    project = _write_project(root / "proj", _copy_sdk(root / "sdk"))
    venv = root / "venv"
    subprocess.run(
        [str(UV), "sync", "--project", str(project)],
        env=base_env(UV_PROJECT_ENVIRONMENT=str(venv)),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return project, venv / "bin" / "python"


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bundle-cache")


@pytest.fixture(scope="module")
def bundle(rollout: tuple[Path, Path], cache_root: Path) -> Bundle:
    project, python = rollout
    return build_bundle(project, python=python, cache_root=cache_root, uv=str(UV))


def _wheels(bundle: Bundle) -> dict[str, Path]:
    return {p.name: p for p in (bundle.directory / "wheels").glob("*.whl")}


def _one(wheels: dict[str, Path], prefix: str) -> Path:
    found = [p for n, p in wheels.items() if n.startswith(prefix)]
    assert len(found) == 1, (prefix, sorted(wheels))
    return found[0]


def test_the_bundle_has_the_rollout_the_sdk_and_every_dependency(bundle: Bundle) -> None:
    wheels = _wheels(bundle)
    assert bundle.requirement == "rollbridge-rollout-bundle-probe-rollout"
    assert bundle.package_dir_name == "rollbridge_rollout"
    own = _one(wheels, "rollbridge_rollout_bundle_probe_rollout-0.3.0-py3-none-any")
    with zipfile.ZipFile(own) as archive:
        names = set(archive.namelist())
        metadata = archive.read(
            "rollbridge_rollout_bundle_probe_rollout-0.3.0.dist-info/METADATA"
        ).decode()
    assert {
        "rollbridge_rollout/main.py",
        "rollbridge_rollout/helpers/words.py",
        "rollbridge_rollout/data.json",
    } <= names
    assert not [n for n in names if ".env" in n or "__pycache__" in n or "junk" in n], names
    assert "Requires-Dist: rollbridge" in metadata
    assert "Requires-Python: >=3.11" in metadata
    _one(wheels, "rollbridge-0.1.0-py3-none-any")
    for dependency in ("trio-", "msgspec-", "hypercorn-", "httpx-", "sniffio-"):
        _one(wheels, dependency)
    assert not [n for n in wheels if n.startswith(("pip-", "setuptools-"))]
    uv = bundle.directory / "uv"
    assert uv.is_file() and uv.stat().st_mode & 0o111
    manifest = json.loads((bundle.directory / "manifest.json").read_text())
    assert manifest["digest"] == bundle.digest
    assert manifest["python"] == "3.11"
    assert {w["file"] for w in manifest["wheels"]} == set(wheels)
    for entry in manifest["wheels"]:
        assert entry["sha256"] == hashlib.sha256(wheels[entry["file"]].read_bytes()).hexdigest()


def test_repacked_wheels_hold_the_installed_bytes(
    bundle: Bundle, rollout: tuple[Path, Path]
) -> None:
    _, python = rollout
    site = next((python.parent.parent / "lib").glob("python3.*/site-packages"))
    msgspec = _one(_wheels(bundle), "msgspec-")
    assert not wheel_is_pure(msgspec.name) and "-cp311-" in msgspec.name
    installed_record = next(site.glob("msgspec-*.dist-info")) / "RECORD"
    installed = {r[0]: r[1] for r in csv.reader(io.StringIO(installed_record.read_text())) if r}
    with zipfile.ZipFile(msgspec) as archive:
        record_name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        repacked = dict(
            (r[0], r[1]) for r in csv.reader(io.StringIO(archive.read(record_name).decode())) if r
        )
    compiled = [n for n in installed if n.endswith(".so")]
    assert compiled
    for name in [*compiled, "msgspec/__init__.py"]:
        assert repacked[name] == installed[name], name
    assert not [n for n in repacked if n.endswith(("INSTALLER", "REQUESTED", "direct_url.json"))]


async def test_a_second_build_is_a_cache_hit(
    bundle: Bundle, rollout: tuple[Path, Path], cache_root: Path
) -> None:
    project, python = rollout
    manifest = bundle.directory / "manifest.json"
    before = manifest.stat().st_mtime_ns
    started = time.monotonic()
    with trio.fail_after(60):
        # A uv that does not exist: any build would fail, so success means nothing was built.
        again = await trio.to_thread.run_sync(
            lambda: build_bundle(
                project, python=python, cache_root=cache_root, uv="/nonexistent/uv"
            )
        )
    elapsed = time.monotonic() - started
    assert again == bundle
    assert manifest.stat().st_mtime_ns == before
    assert elapsed < 5.0, elapsed  # the spec's "well under a second", with room for a busy box
    leftovers = await trio.Path(cache_root).iterdir()
    assert [p.name for p in leftovers if p.name.startswith(".tmp-")] == []


async def test_a_build_prunes_the_cache_to_the_most_recently_used_and_the_held(
    rollout: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each edit of a rollout makes a new bundle (about 40 MB with its uv): a build keeps
    ``$ROLLBRIDGE_BUNDLE_KEEP`` of them and those a live process holds, and says so."""
    project, python = rollout
    cache = tmp_path / "cache"
    old = []
    for n in range(4):  # n = 0 is the most recent
        name = f"{n:064x}"
        (cache / name).mkdir(parents=True)
        (cache / name / "uv").write_bytes(b"u" * 4096)
        (cache / f"{name}.lock").touch()
        os.utime(cache / f"{name}.lock", (1e9 - n, 1e9 - n))
        old.append(name)
    held = hold(cache, old[3])  # the oldest, in use by a live run
    os.utime(cache / f"{old[3]}.lock", (1.0, 1.0))  # and still the least recently used
    monkeypatch.setenv("ROLLBRIDGE_BUNDLE_KEEP", "2")
    lines: list[str] = []
    with trio.fail_after(300):
        built = await trio.to_thread.run_sync(
            lambda: build_bundle(
                project, python=python, cache_root=cache, uv=str(UV), log=lines.append
            )
        )
    try:
        left = sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))
        assert left == sorted([built.digest, old[0], old[3]])
        assert [line for line in lines if line.startswith("bundle cache: kept 2, removed 2 ")]
        assert built.hold is not None and built.hold.held
    finally:
        held.release()
        if built.hold is not None:
            built.hold.release()


@pytest.fixture(scope="module")
def moved_project(rollout: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the rollout project elsewhere (the same files)."""
    moved = tmp_path_factory.mktemp("bundle-moved") / "proj"
    shutil.copytree(rollout[0], moved)
    return moved


@pytest.fixture(scope="module")
def changed_bundle(
    bundle: Bundle, moved_project: Path, rollout: tuple[Path, Path], cache_root: Path
) -> Bundle:
    """The bundle of the moved copy after one of its files changed."""
    (moved_project / "helpers" / "words.py").write_text("def shout(s):\n    return s + '!'\n")
    return build_bundle(moved_project, python=rollout[1], cache_root=cache_root, uv=str(UV))


async def test_the_digest_follows_the_files_not_the_location(
    bundle: Bundle, rollout: tuple[Path, Path], cache_root: Path, tmp_path: Path
) -> None:
    project, python = rollout
    moved = tmp_path / "elsewhere"
    shutil.copytree(project, moved)
    with trio.fail_after(60):
        same = await trio.to_thread.run_sync(
            lambda: build_bundle(moved, python=python, cache_root=cache_root, uv="/nonexistent/uv")
        )
    assert same.digest == bundle.digest


def test_a_changed_source_file_changes_the_digest(bundle: Bundle, changed_bundle: Bundle) -> None:
    changed = changed_bundle
    assert changed.digest != bundle.digest
    own = _one(_wheels(changed), "rollbridge_rollout_")
    with zipfile.ZipFile(own) as archive:
        assert b"s + '!'" in archive.read("rollbridge_rollout/helpers/words.py")


def test_the_supervisors_own_wheel_replaces_the_checkouts_sdk(
    rollout: tuple[Path, Path], cache_root: Path, bundle: Bundle, tmp_path: Path
) -> None:
    """With ROLLBRIDGE_WHEELHOUSE (the supervisor's wheel, launcher.selfwheel) holding the
    venv's rollbridge version, the sandbox gets that wheel, not one built from the path source."""
    shipped = tmp_path / "wheelhouse"
    subprocess.run(
        [str(UV), "build", "--wheel", "--out-dir", str(shipped), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (ours,) = shipped.glob("rollbridge-*.whl")
    project, python = rollout
    other = build_bundle(
        project, python=python, cache_root=cache_root, uv=str(UV), wheelhouse=shipped
    )
    assert other.digest != bundle.digest
    inside = _one(_wheels(other), "rollbridge-")
    assert inside.read_bytes() == ours.read_bytes()
    manifest = json.loads((other.directory / "manifest.json").read_text())
    kinds = {e["name"]: e["kind"] for e in manifest["wheels"]}
    assert kinds["rollbridge"] == "shipped"
    # A wheelhouse without the venv's version changes nothing.
    (ours).rename(shipped / "rollbridge-0.0.1-py3-none-any.whl")
    same = build_bundle(
        project, python=python, cache_root=cache_root, uv=str(UV), wheelhouse=shipped
    )
    assert same.digest == bundle.digest


async def test_errors_are_one_line_and_say_what_to_do(
    rollout: tuple[Path, Path], tmp_path: Path
) -> None:
    _, python = rollout
    cache = tmp_path / "cache"
    with trio.fail_after(120):
        with pytest.raises(BundleError) as missing:
            await trio.to_thread.run_sync(
                lambda: build_bundle(tmp_path, python=python, cache_root=cache)
            )
        assert "has no pyproject.toml" in str(missing.value)
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "main.py").write_text("")
        (broken / "pyproject.toml").write_text(
            '[project]\nname = "broken"\nversion = "1"\ndependencies = ["not a requirement !!"]\n'
        )
        with pytest.raises(BundleError) as failed:
            await trio.to_thread.run_sync(
                lambda: build_bundle(broken, python=python, cache_root=cache, uv=str(UV))
            )
        (broken / "main.py").write_text("# changed\n")
        with pytest.raises(BundleError) as no_uv:
            await trio.to_thread.run_sync(
                lambda: build_bundle(broken, python=python, cache_root=cache, uv="/nonexistent/uv")
            )
    assert "uv build of the rollout broken" in str(failed.value)
    assert "failed:" in str(failed.value)
    assert "not an executable" in str(no_uv.value)
    for error in (missing.value, failed.value, no_uv.value):
        assert "\n" not in str(error)
    assert not [p for p in cache.iterdir() if not p.name.startswith(".")]


# --- the sandbox image (real podman) -------------------------------------------------------


@pytest.fixture(scope="module")
def made_images() -> Iterator[list[str]]:
    """Tags the tests built; removed at the end of the module."""
    tags: list[str] = []
    yield tags
    if tags:
        subprocess.run(["podman", "rmi", "-f", *tags], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def image(testbed: None, bundle: Bundle, made_images: list[str]) -> SandboxImage:
    async def build() -> SandboxImage:
        with trio.fail_after(300):
            return await ensure_image("podman", TASK_ENV, bundle)

    built = trio.run(build)
    made_images.append(built.tag)
    return built


def _dangling() -> list[str]:
    listed = _podman("images", "-a", "--filter", "dangling=true", "--format", "{{.ID}}")
    return listed.stdout.split()


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def test_the_image_runs_the_rollout_offline(image: SandboxImage, bundle: Bundle) -> None:
    assert image.tag.startswith("localhost/rollbridge-sandbox:")
    assert image.tag.endswith(image.digest[:16])
    assert image.python_version.startswith("3.11.")
    check = (
        "import importlib.util, sys, rollout_server, trio, msgspec; "
        f"d = importlib.util.find_spec({bundle.package_dir_name!r}).submodule_search_locations[0]; "
        "sys.path.insert(0, d); import main; print(main.WORKFLOW, sys.prefix)"
    )
    ran = _podman(
        "run",
        "--rm",
        "--network",
        "none",
        image.tag,
        "/opt/rollbridge/venv/bin/python",
        "-c",
        check,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["OK", "/opt/rollbridge/venv"]
    labels = _podman("image", "inspect", "--format", "{{json .Labels}}", image.tag)
    assert json.loads(labels.stdout)[SANDBOX_LABEL] == "1"


async def test_a_second_ensure_image_is_a_cache_hit(image: SandboxImage, bundle: Bundle) -> None:
    created = _podman("image", "inspect", "--format", "{{.Id}}", image.tag).stdout
    with trio.fail_after(60):
        again = await ensure_image("podman", TASK_ENV, bundle)
    assert again == image
    assert _podman("image", "inspect", "--format", "{{.Id}}", image.tag).stdout == created


def test_a_new_bundle_gets_an_image_with_its_files(
    image: SandboxImage, changed_bundle: Bundle, made_images: list[str]
) -> None:
    async def build() -> SandboxImage:
        with trio.fail_after(300):
            return await ensure_image("podman", TASK_ENV, changed_bundle)

    changed = trio.run(build)
    made_images.append(changed.tag)
    assert changed.tag != image.tag
    check = "import sys; sys.path.insert(0, sys.argv[1]); import main; print(main.WORKFLOW)"
    site = "/opt/rollbridge/venv/lib/python3.11/site-packages/rollbridge_rollout"
    ran = _podman(
        "run",
        "--rm",
        "--network",
        "none",
        changed.tag,
        "/opt/rollbridge/venv/bin/python",
        "-c",
        check,
        site,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "ok!"


async def test_a_trial_image_on_top_leaves_the_sandbox_image(
    image: SandboxImage, tmp_path: Path
) -> None:
    (tmp_path / "Dockerfile").write_text(trial_dockerfile(image))
    tag = "localhost/rollbridge-bundle-test-trial:1"
    with trio.fail_after(120):
        built = await trio.run_process(
            ["podman", "build", "--network", "none", "-t", tag, str(tmp_path)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert built.returncode == 0, built.stderr.decode()[-500:]
    labels = json.loads(_podman("image", "inspect", "--format", "{{json .Labels}}", tag).stdout)
    assert labels[SANDBOX_LABEL] == "trial"
    assert labels[f"{SANDBOX_LABEL}.base"] == image.tag
    # What podman-compose does at a trial's teardown: remove the trial's image by name.
    assert _podman("rmi", tag).returncode == 0
    assert _podman("image", "exists", image.tag).returncode == 0


async def test_a_python_mismatch_with_a_platform_wheel_says_how_to_fix_it(
    testbed: None, bundle: Bundle, tmp_path: Path, made_images: list[str]
) -> None:
    # The same wheels, but claimed to come from a Python 3.99 venv.
    fake = tmp_path / "bundles" / ("e" * 64)
    shutil.copytree(bundle.directory, fake, copy_function=shutil.copy)
    manifest = json.loads((fake / "manifest.json").read_text())
    manifest["python"] = "3.99"
    (fake / "manifest.json").write_text(json.dumps(manifest))
    other = Bundle("e" * 64, fake, bundle.requirement, bundle.package_dir_name)
    with trio.fail_after(300), pytest.raises(BundleError) as mismatch:
        await ensure_image("podman", TASK_ENV, other)
    message = str(mismatch.value)
    assert "Python 3.99" in message and "python3 is 3.11." in message
    # A compiled wheel of the base install is named (httptools or msgspec, the first found).
    assert ("httptools-" in message or "msgspec-" in message) and ".python-version" in message
    assert "\n" not in message


async def test_an_image_without_python3_is_a_clear_error(
    testbed: None, bundle: Bundle, tmp_path: Path
) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "Dockerfile").write_text("FROM localhost/local/bookworm-harbor\nENV PATH=/nowhere\n")
    before = set(_dangling())
    try:
        with trio.fail_after(300), pytest.raises(BundleError) as missing:
            await ensure_image("podman", env, bundle)
    finally:
        # The ENV step's layer stays behind as an untagged image: remove it (only ours).
        ours = [i for i in _dangling() if i not in before]
        if ours:
            _podman("rmi", "-f", *ours)
    assert "has no python3 on PATH" in str(missing.value)
    assert str(env) in str(missing.value)


async def test_a_failed_build_says_what_failed(
    testbed: None, bundle: Bundle, tmp_path: Path
) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "Dockerfile").write_text("FROM localhost/local/bookworm-harbor\nRUN exit 7\n")
    with trio.fail_after(300), pytest.raises(BundleError) as failed:
        await ensure_image("podman", env, bundle)
    message = str(failed.value)
    assert message.startswith("building the sandbox image failed:")
    assert "exit 7" in message and "\n" not in message


def _build_containers() -> set[str]:
    listed = _podman("ps", "--all", "--external", "--format", "{{.ID}} {{.Names}}")
    return {line.split()[0] for line in listed.stdout.splitlines() if "-working-container" in line}


async def test_a_build_cut_short_leaves_no_working_container(
    testbed: None, bundle: Bundle, tmp_path: Path
) -> None:
    """A Ctrl-C during the image build killed ``podman build``, which left its buildah working
    containers behind (``podman ps --external``), two per attempt, never reaped."""
    env = tmp_path / "environment"
    shutil.copytree(TASK_ENV, env)
    dockerfile = env / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\nRUN sleep 120\n")
    before = _build_containers()
    building = trio.Event()

    def log(line: str) -> None:
        if "building" in line:
            building.set()

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:

            async def cut_short() -> None:
                await building.wait()
                # Until the RUN step has its working container.
                while not _build_containers() - before:
                    await trio.sleep(0.2)
                nursery.cancel_scope.cancel()

            nursery.start_soon(cut_short)
            await ensure_image("podman", env, bundle, log=log)
    assert _build_containers() - before == set()
