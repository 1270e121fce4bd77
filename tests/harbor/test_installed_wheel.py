"""The same installed wheel runs the Harbor workflow example (issue 30): rollbridge installed
from its wheel into a fresh venv, no checkout on any path and the wheel file gone, runs
``examples/harbor``'s ``workflow.toml``; the rollout environment and the in-sandbox bundle get
rollbridge from the supervisor's own wheel (repacked from the installed files), never from this
checkout."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.harbor.conftest import EXAMPLE, HARBOR_VENV
from tests.launcher.test_packaging import REPO, UV, _build, _scan_for

pytestmark = pytest.mark.slow


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(1500)
def test_an_installed_wheel_runs_the_harbor_workflow_example(testbed: None, tmp_path: Path) -> None:
    if not UV.is_file():
        pytest.skip("needs uv next to this interpreter (the cli extra)")
    outside = tmp_path / "user"
    outside.mkdir()
    (wheel,) = _build(tmp_path / "dist", "--wheel")
    cache = tmp_path / "cache"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY")
        and k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "OPENAI_BASE_URL")
    }
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        HARBOR_TELEMETRY="0",
        XDG_CACHE_HOME=str(cache),  # a fresh self-wheel cache; uv keeps its own
        UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv")),
        UV_PYTHON_DOWNLOADS="never",
        ROLLBRIDGE_HARBOR=str(HARBOR_VENV / "bin" / "harbor"),
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
    wheel.unlink()
    # The example, as a user would have it: rollbridge by name, no path source to a checkout.
    ws = outside / "harbor"
    shutil.copytree(
        EXAMPLE, ws, ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__")
    )
    (ws / "configs" / "training").mkdir(parents=True, exist_ok=True)
    pyproject = ws / "rollouts" / "harbor_hello" / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.split("[tool.uv.sources]")[0])
    assert str(REPO) not in pyproject.read_text() and "../../../.." not in pyproject.read_text()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["rollbridge", "eval", "run", "configs/eval/workflow.toml", "--yes", "--name", "wheel"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Evaluation run finished:" in result.stdout
    run = ws / ".osmosis" / "evals" / "wheel"
    index = [json.loads(line) for line in (run / "index.jsonl").read_text().splitlines()]
    assert [(row["status"], row.get("reward")) for row in index] == [("success", 1.0)] * 3
    # The rollout environment got rollbridge from the self-wheel (repacked from the install).
    self_wheels = sorted((cache / "rollbridge" / "self-wheel").glob("*/rollbridge-*.whl"))
    assert len(self_wheels) == 1, self_wheels
    lock = (ws / "rollouts" / "harbor_hello" / "uv.lock").read_text()
    assert str(self_wheels[0].parent) in lock
    # The sandbox bundle carries that very wheel (same bytes), not one built from a checkout.
    bundles = [
        p.parent
        for p in (Path.home() / ".cache" / "rollbridge" / "bundles").glob("*/manifest.json")
        if any(w.name == self_wheels[0].name for w in p.parent.rglob("rollbridge-*.whl"))
    ]
    digests = {_sha256(w) for b in bundles for w in b.rglob("rollbridge-*.whl") if w.is_file()}
    assert _sha256(self_wheels[0]) in digests, (bundles, digests)
    with zipfile.ZipFile(self_wheels[0]) as built:
        assert "rollout_server/sandbox/runner.py" in built.namelist()
    assert _scan_for(ws, str(REPO).encode()) == []
