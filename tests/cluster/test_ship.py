"""The node cache of shipped bundles (launcher/cluster/ship.py), without Ray: a venv built offline
once per digest, reused after, one build when agents race, a crashed build made again, and a
failed build reported in one line.

The bundles here are made by hand (a one-package wheel, the layout ``pack`` ships), so each test
builds a real venv with the real uv in about a second and nothing needs the package index: every
uv call runs with ``--offline``/``UV_OFFLINE=1``, and the index URLs point at a closed port.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from launcher.cluster.ship import NodeEnv, ShipError, ShipInfo, ensure_env
from rollout_server.harbor.bundle import SHIPPED_BUNDLE_ENV, shipped_bundle

MM = f"{sys.version_info[0]}.{sys.version_info[1]}"
MAIN = 'print("hello from", __file__)\n'


@pytest.fixture(autouse=True)
def _no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_INDEX_URL"):
        monkeypatch.setenv(name, "http://127.0.0.1:9/simple")


def _wheel(name: str, files: dict[str, str]) -> tuple[str, bytes]:
    """A pure wheel of distribution ``name`` 0.1.0 holding ``files``."""
    dist = name.replace("-", "_")
    info = f"{dist}-0.1.0.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n"
    contents[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = "\n".join(record) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
    return f"{dist}-0.1.0-py3-none-any.whl", buffer.getvalue()


def _shipped(tag: str, *, with_wheel: bool = True) -> tuple[ShipInfo, bytes]:
    """A bundle tar in ``pack``'s layout whose rollout prints ``tag``; its facts."""
    name = f"rollbridge-rollout-{tag}"
    filename, wheel = _wheel(
        name,
        {
            "rollbridge_rollout/__init__.py": "",
            "rollbridge_rollout/main.py": MAIN.replace("hello", tag),
        },
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        manifest = {
            "python": MM,
            "digest": hashlib.sha256(tag.encode()).hexdigest(),
            "requirement": name,
            "package_dir_name": "rollbridge_rollout",
        }
        entries = {"manifest.json": json.dumps(manifest).encode()}
        if with_wheel:
            entries[f"wheels/{filename}"] = wheel
        for path, data in entries.items():
            member = tarfile.TarInfo(path)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    data = buffer.getvalue()
    info = ShipInfo(
        digest=hashlib.sha256(tag.encode()).hexdigest(),
        requirement=name,
        package_dir_name="rollbridge_rollout",
        python=MM,
        entrypoint="main.py",
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return info, data


class _Fetch:
    """The agent's fetch from the object store, counted."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> bytes:
        with self._lock:
            self.calls += 1
        return self.data


async def _ensure(info: ShipInfo, fetch: Callable[[], bytes], root: Path) -> NodeEnv:
    return await trio.to_thread.run_sync(ensure_env, info, fetch, root)


def _runs(env: NodeEnv) -> str:
    done = subprocess.run(
        [str(env.python), str(env.entrypoint)],
        cwd=env.rollout_dir,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


async def test_builds_offline_once_per_digest_then_reuses(tmp_path: Path) -> None:
    info, data = _shipped("alpha")
    fetch = _Fetch(data)
    with trio.fail_after(120):
        env = await _ensure(info, fetch, tmp_path)
        assert env.built and fetch.calls == 1
        assert env.python == tmp_path / info.digest / "venv" / "bin" / "python"
        assert env.entrypoint.is_relative_to(tmp_path / info.digest / "venv")
        assert "alpha from" in await trio.to_thread.run_sync(_runs, env)
        again = await _ensure(info, fetch, tmp_path)
    assert not again.built and fetch.calls == 1, "a ready environment was fetched again"
    assert (again.python, again.entrypoint) == (env.python, env.entrypoint)


async def test_the_environment_carries_a_complete_sandbox_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Harbor replica bakes into its sandbox image: the shipped bundle with this node's
    uv (and uv beside the venv's interpreter, for what the server builds itself)."""
    info, data = _shipped("sandbox")
    with trio.fail_after(120):
        env = await _ensure(info, _Fetch(data), tmp_path)
        assert env.bundle == tmp_path / info.digest / "bundle"
        assert os.access(env.bundle / "uv", os.X_OK) and (env.python.parent / "uv").is_file()
        monkeypatch.setenv(SHIPPED_BUNDLE_ENV, str(env.bundle))
        found = shipped_bundle()
        assert found is not None
        assert (found.digest, found.requirement) == (info.digest, info.requirement)
        # An environment built before its bundle had uv gets it when reused.
        (env.bundle / "uv").unlink()
        again = await _ensure(info, _Fetch(data), tmp_path)
    assert not again.built and (again.bundle / "uv").is_file()
    monkeypatch.setenv(SHIPPED_BUNDLE_ENV, str(tmp_path / "nowhere"))
    assert shipped_bundle() is None


async def test_another_digest_gets_its_own_environment(tmp_path: Path) -> None:
    (a, a_data), (b, b_data) = _shipped("one"), _shipped("two")
    with trio.fail_after(120):
        first = await _ensure(a, _Fetch(a_data), tmp_path)
        second = await _ensure(b, _Fetch(b_data), tmp_path)
        assert second.built and second.python.parent.parent.parent.name == b.digest
        assert "one from" in await trio.to_thread.run_sync(_runs, first)
        assert "two from" in await trio.to_thread.run_sync(_runs, second)


async def test_agents_racing_on_one_node_build_once(tmp_path: Path) -> None:
    info, data = _shipped("race")
    fetch = _Fetch(data)
    envs: list[NodeEnv] = []

    async def agent() -> None:
        envs.append(await _ensure(info, fetch, tmp_path))

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(agent)
    assert fetch.calls == 1
    assert sorted(e.built for e in envs) == [False, False, False, True]
    assert len({e.python for e in envs}) == 1


async def test_a_crashed_build_is_made_again(tmp_path: Path) -> None:
    info, data = _shipped("crash")
    leftover = tmp_path / info.digest
    (leftover / "venv").mkdir(parents=True)
    (leftover / "venv" / "junk").write_text("half a build")
    with trio.fail_after(120):
        env = await _ensure(info, _Fetch(data), tmp_path)
    assert env.built and not (leftover / "venv" / "junk").exists()


async def test_a_failed_build_says_why_in_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    info, broken = _shipped("broken", with_wheel=False)
    with trio.fail_after(120):
        with pytest.raises(ShipError) as caught:
            await _ensure(info, _Fetch(broken), tmp_path)
    message = str(caught.value)
    assert "uv pip install" in message and "\n" not in message
    assert not (tmp_path / info.digest).exists()
    # The same digest with good bytes builds (nothing half-made blocks it).
    good, data = _shipped("broken")
    with trio.fail_after(120):
        assert (await _ensure(good, _Fetch(data), tmp_path)).built


async def test_bytes_that_do_not_match_are_refused(tmp_path: Path) -> None:
    info, data = _shipped("tampered")
    with trio.fail_after(60):
        with pytest.raises(ShipError, match="does not match"):
            await _ensure(info, _Fetch(data + b"x"), tmp_path)
        bad = ShipInfo(**{**_fields(info), "digest": "../../etc"})
        with pytest.raises(ShipError, match="malformed bundle digest"):
            await _ensure(bad, _Fetch(data), tmp_path)
    assert _left(tmp_path) == []


def _left(root: Path) -> list[str]:
    """What a node cache holds besides its lock files (use and build locks)."""
    return [p.name for p in root.iterdir() if p.suffix not in (".lock", ".build")]


def _fields(info: ShipInfo) -> dict[str, str]:
    return {name: getattr(info, name) for name in info.__struct_fields__}


async def test_each_build_prunes_the_cache_but_never_a_held_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$ROLLBRIDGE_NODE_CACHE_KEEP`` environments stay besides the held ones (an agent holds
    its own for its life); a reuse prunes nothing; a pruned one is built again when asked."""
    monkeypatch.setenv("ROLLBRIDGE_NODE_CACHE_KEEP", "1")
    (one, one_data), (two, two_data), (three, three_data) = (
        _shipped("keep-one"),
        _shipped("keep-two"),
        _shipped("keep-three"),
    )
    with trio.fail_after(180):
        first = await _ensure(one, _Fetch(one_data), tmp_path)  # held: a live agent
        second = await _ensure(two, _Fetch(two_data), tmp_path)
        assert second.pruned.entries == 0, "a held environment was pruned"
        assert second.hold is not None
        second.hold.release()  # its agent is gone
        third = await _ensure(three, _Fetch(three_data), tmp_path)
        assert third.pruned.entries == 1 and third.pruned.bytes > 0
        assert sorted(_left(tmp_path)) == sorted([one.digest, three.digest])
        assert "keep-one from" in await trio.to_thread.run_sync(_runs, first)
        reused = await _ensure(three, _Fetch(three_data), tmp_path)
        assert not reused.built and reused.pruned.entries == 0
        assert first.hold is not None
        first.hold.release()
        again = await _ensure(two, _Fetch(two_data), tmp_path)
    assert again.built, "a pruned environment was not built again"
    # Keep 1 (its own); the other two are held by `third` and `reused`: both stay.
    assert again.pruned.entries == 1 and sorted(_left(tmp_path)) == sorted(
        [two.digest, three.digest]
    )
