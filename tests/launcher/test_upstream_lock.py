"""The upstream's identity is part of a run's model lock (issue 13, item 7): a resume against
another base URL is refused with ``Changed: model``, a key never reaches the manifest, and run
directories written before the lock existed still resume. The same refusal through the real
CLI is in ``e2e/test_upstream_lock_e2e.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.config import EvalConfig, ExperimentConfig, RunSpec, upstream_base_url
from launcher.dataset import select_rows
from launcher.errors import CLIError
from launcher.rundir.manifest import build_inputs, changed_groups, manifest_gate


@pytest.mark.parametrize(
    ("model", "environ", "expected"),
    [
        ("openai/gpt-4o-mini", {}, "https://api.openai.com/v1"),
        ("openai/m", {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1/"}, "http://127.0.0.1:8000/v1"),
        ("openai/m", {"OPENAI_API_BASE": "http://h:1/v1"}, "http://h:1/v1"),
        ("openrouter/a/b", {}, "https://openrouter.ai/api/v1"),
        ("hosted_vllm/m", {"HOSTED_VLLM_API_BASE": "http://gpu:8000/v1"}, "http://gpu:8000/v1"),
        ("anthropic/claude", {"ANTHROPIC_API_BASE": "https://proxy.test"}, "https://proxy.test"),
        ("anthropic/claude", {}, None),
        ("rollbridge/echo", {"OPENAI_BASE_URL": "http://x/v1"}, None),
    ],
)
def test_upstream_base_url(model: str, environ: dict[str, str], expected: str | None) -> None:
    assert upstream_base_url(model, environ) == expected


def test_a_key_in_the_base_url_never_reaches_the_lock() -> None:
    environ = {"OPENAI_BASE_URL": "https://user:sk-secret-1@[::1]:8443/v1?api-key=sk-secret-2#x"}
    assert upstream_base_url("openai/m", environ) == "https://[::1]:8443/v1"


def _inputs(tmp_path: Path, environ: dict[str, str]) -> dict[str, object]:
    data = tmp_path / "d.jsonl"
    data.write_text('{"user_prompt": "a", "ground_truth": "a"}\n')
    config = EvalConfig(
        path=tmp_path / "x.toml", experiment=ExperimentConfig("echo", "main.py", "openai/m", "d")
    )
    selection = select_rows(data, rows=None)
    return build_inputs(config, RunSpec(), selection, "f" * 64, environ=environ)


def test_another_upstream_is_refused_with_changed_model(tmp_path: Path) -> None:
    run = tmp_path / "out" / "r"
    first = _inputs(tmp_path, {"OPENAI_BASE_URL": "http://127.0.0.1:1111/v1"})
    manifest_gate(run, "r", first, {}, fresh=False)
    moved = _inputs(tmp_path, {"OPENAI_BASE_URL": "http://127.0.0.1:2222/v1"})
    assert changed_groups(first, moved) == ["model"]
    with pytest.raises(CLIError) as info:
        manifest_gate(run, "r", moved, {}, fresh=False)
    assert "Changed: model. Restart under the same name with --fresh" in info.value.message
    assert "upstream_base_url" in (run / "manifest.json").read_text()


def test_a_run_dir_from_before_the_lock_still_resumes(tmp_path: Path) -> None:
    run = tmp_path / "out" / "r"
    current = _inputs(tmp_path, {})
    older = {k: v for k, v in current.items() if k != "model"}
    created = manifest_gate(run, "r", older, {}, fresh=False)
    assert "model" not in json.loads((run / "manifest.json").read_text())["inputs"]
    again = manifest_gate(run, "r", current, {}, fresh=False)
    assert not again.created and again.manifest.local_run_id == created.manifest.local_run_id
