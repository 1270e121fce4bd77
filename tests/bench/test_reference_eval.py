"""scripts/bench/reference_eval.py: the reference (osmosis-ai 0.3.8) run for side-by-side benchmarks."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio

from tests.fakes.upstream import FakeUpstream
from tests.rollout_server.interop_env import NoPython312, find_python312

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    name = "reference_eval"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, REPO / "scripts" / "bench" / "reference_eval.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


ref = _load()


def test_inputs_have_the_benchmark_rows_and_concurrency(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    config, dataset = ref.write_inputs(tmp_path, 3, 7)
    rows = [json.loads(line) for line in (tmp_path / dataset).read_text().splitlines()]
    assert rows == [
        {"user_prompt": f"Repeat after me: word{i}", "ground_truth": f"word{i}"} for i in range(3)
    ]
    text = (tmp_path / config).read_text()
    assert 'model_path = "openai/fake-model"' in text
    assert "batch_size = 7" in text
    assert "n = 1" in text


def _index(run_dir: Path, items: list[dict[str, object]]) -> None:
    run_dir.mkdir()
    (run_dir / "index.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))


def _run(run_dir: Path, rows: int, calls: int | None) -> object:
    counts = ref.read_outcomes(run_dir)
    return ref.ReferenceRun(
        name="r",
        rows=rows,
        in_flight=1,
        wall_s=1.0,
        start_to_first_dispatch_s=None,
        dispatch_wall_s=None,
        last_result_to_exit_s=None,
        exit_code=0,
        succeeded=counts["success"],
        failed=counts["failed"],
        skipped=counts["skipped"],
        rewarded=counts["rewarded"],
        cpu_s=0.0,
        cli_cpu_s=0.0,
        upstream_calls=calls,
        run_dir=run_dir,
    )


def test_a_run_short_of_rewarded_rows_is_refused(tmp_path: Path) -> None:
    _index(
        tmp_path / "run",
        [
            {"row_index": 0, "status": "success", "reward": 1.0},
            {"row_index": 1, "status": "success", "reward": 0.0},
            {"row_index": 2, "status": "failed", "error_type": "agent_error"},
            {"row_index": 3, "status": "skipped"},
        ],
    )
    (tmp_path / "out").write_text("last line\n")
    run = _run(tmp_path / "run", 4, 4)
    assert (run.succeeded, run.failed, run.skipped, run.rewarded) == (2, 1, 1, 1)
    with pytest.raises(
        ref.ReferenceRunFailed, match=re.escape("1 of 4 rows succeeded with reward 1.0")
    ):
        ref.verify_run(run, tmp_path / "out")


def test_a_run_the_upstream_did_not_see_is_refused(tmp_path: Path) -> None:
    _index(tmp_path / "run", [{"row_index": 0, "status": "success", "reward": 1.0}])
    (tmp_path / "out").write_text("")
    ref.verify_run(_run(tmp_path / "run", 1, 2), tmp_path / "out")
    with pytest.raises(ref.ReferenceRunFailed, match="the upstream saw 0 chat calls for 1 rows"):
        ref.verify_run(_run(tmp_path / "run", 1, 0), tmp_path / "out")


@pytest.fixture
def reference_ready() -> None:
    """Skip, with the reason, unless the reference eval can run here. A sync fixture: a skip
    raised inside the trio test body reached pytest without its reason."""
    if (
        not sys.modules["reference_setup"].ENV_DIR.exists()
        and os.environ.get("ROLLBRIDGE_BUILD_REFERENCE") != "1"
    ):
        # The first build installs osmosis-ai[eval] (about 630 MB, 2 minutes): a benchmark's
        # cost, not one every CI run on a fresh machine should pay.
        print(
            "SKIP reference eval: not built (run scripts/bench/reference_eval.py once, or set "
            "ROLLBRIDGE_BUILD_REFERENCE=1)"
        )
        pytest.skip("the reference eval is not built here; ROLLBRIDGE_BUILD_REFERENCE=1 builds it")
    try:
        find_python312()
    except NoPython312 as exc:
        print(f"SKIP reference eval: {exc}")
        pytest.skip(f"the reference needs Python 3.12: {exc}")


@pytest.mark.interop
@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_the_reference_runs_every_row_through_the_upstream(
    reference_ready: None, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    with trio.fail_after(900):
        # The first build installs osmosis-ai[eval] (minutes); later ones are checks only.
        await trio.to_thread.run_sync(ref.ensure_reference)

    def seen() -> int:
        return sum(1 for r in fake_upstream.requests if r.path.endswith("/chat/completions"))

    with trio.fail_after(240):
        run = await ref.run_reference_eval(
            fake_upstream.v1,
            12,
            4,
            work=tmp_path / "work",
            count_upstream_calls=seen,
            warm_up=False,
        )
    assert (run.exit_code, run.succeeded, run.rewarded, run.failed) == (0, 12, 12, 0)
    assert run.upstream_calls is not None and run.upstream_calls >= 12
    assert run.run_dir == (tmp_path / "work").resolve() / run.name
    assert len((run.run_dir / "events.jsonl").read_text().splitlines()) == 12
    assert run.cpu_s > run.cli_cpu_s > 0
    assert run.start_to_first_dispatch_s is not None and run.dispatch_wall_s is not None
    assert run.last_result_to_exit_s is not None
    assert 0 < run.start_to_first_dispatch_s + run.dispatch_wall_s < run.wall_s
