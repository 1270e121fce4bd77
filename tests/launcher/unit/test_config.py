"""Eval config loading (docs/spec/supervisor.md §1.1) and [evaluation] value checks (§1.3)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from launcher.config import (
    EvalConfig,
    ExperimentConfig,
    advanced_keys_warning,
    load_eval_config,
    resolve_run_spec,
)
from launcher.errors import CLIError

BASE = """
[experiment]
rollout = "echo"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "tiny"
"""
SECRETS = "\n[secrets]\nrequired = []\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.toml"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path) -> CLIError:
    with pytest.raises(CLIError) as info:
        load_eval_config(path)
    assert info.value.code == "VALIDATION"
    return info.value


def test_valid_config_loads_every_section(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        BASE
        + 'branch = "main"\n'
        + "[evaluation]\nn = 2\nlimit = 3\n"
        + '[env]\nLOG_LEVEL = "info"\n'
        + "[advanced]\nzeta = 1\nalpha = 2\n"
        + '[secrets]\nrequired = ["OPENAI_API_KEY"]\n',
    )
    config = load_eval_config(path)
    assert config.experiment == ExperimentConfig(
        rollout="echo",
        entrypoint="main.py",
        model_path="openai/gpt-5-mini",
        dataset="tiny",
        branch="main",
    )
    assert config.evaluation == {"n": 2, "limit": 3}
    assert config.env == {"LOG_LEVEL": "info"}
    assert config.secrets_required == ("OPENAI_API_KEY",)
    assert advanced_keys_warning(config) == (
        "[advanced] keys are recorded but not consumed by `rollbridge eval run`: alpha, zeta"
    )


def test_read_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert error_of(missing).message == f"Config file not found: {missing}"
    bad = write(tmp_path, "[experiment\n")
    assert error_of(bad).message.startswith(f"Invalid TOML in {bad}: ")
    assert error_of(tmp_path).message.startswith(f"Cannot read config file {tmp_path}: ")


#: Configs every one of which load_eval_config refuses at once (also refused by the JSON Schema
#: of the eval config, tests/launcher/unit/test_config_schema.py).
IMMEDIATE_ERRORS = [
    ("[evaluation]\nn=1\n", "Missing [experiment] section in {p}"),
    ('experiment = "x"\n', "[experiment] must be a table in {p}"),
    ('[experiment]\nrollout="a"\n', "Missing 'entrypoint' in [experiment] section of {p}"),
    (
        BASE.replace('dataset = "tiny"\n', ""),
        "Missing 'dataset' in [experiment] section of {p}",
    ),
    ("evaluation = 3\n" + BASE + SECRETS, "[evaluation] must be a table in {p}"),
    ('env = "x"\n' + BASE + SECRETS, "[env] must be a table in {p}"),
    ("advanced = 1\n" + BASE + SECRETS, "[advanced] must be a table in {p}"),
    (BASE, "Missing [secrets] section in {p}"),
    ("secrets = 1\n" + BASE, "[secrets] must be a table in {p}"),
    (
        BASE + "[secrets]\nrequired=[]\nb=1\na=2\n",
        "[secrets] in {p} only supports the 'required' field; unknown key(s): a, b.",
    ),
    (BASE + "[secrets]\n", "Missing 'required' in [secrets] section of {p}"),
    (
        BASE + "[secrets]\nrequired=[1]\n",
        "'required' in [secrets] of {p} must be a list of strings, e.g. required = [\"OPENAI_API_KEY\"].",
    ),
    (
        BASE + '[secrets]\nrequired="A"\n',
        "'required' in [secrets] of {p} must be a list of strings, e.g. required = [\"OPENAI_API_KEY\"].",
    ),
    (
        BASE + '[env]\nbad_name = "x"\n' + SECRETS,
        "Invalid env var name 'bad_name' in [env] of {p}: must match ^[A-Z_][A-Z0-9_]*$",
    ),
    (
        BASE + '[env]\n_OSMOSIS_X = "x"\n' + SECRETS,
        "Invalid env var name '_OSMOSIS_X' in [env] of {p}: env var names starting with "
        "_OSMOSIS_ are reserved by the platform; choose a different name.",
    ),
    (
        BASE + '[secrets]\nrequired=["B","A","B","A","C"]\n',
        "Duplicate secret name(s) in [secrets].required of {p}: A, B. Each name must appear once.",
    ),
    (
        BASE + '[secrets]\nrequired=["_A"]\n',
        "Invalid secret name '_A' in [secrets].required of {p}: must match ^[A-Z][A-Z0-9_]*$",
    ),
    (
        BASE + '[env]\nX = "1"\nY = "2"\n[secrets]\nrequired=["Y","X"]\n',
        "Name(s) appear in both [env] and [secrets] of {p}: X, Y. Each env var name must come "
        "from exactly one place.",
    ),
]


@pytest.mark.parametrize(("text", "message"), IMMEDIATE_ERRORS)
def test_immediate_errors(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path).message == message.format(p=path)


def test_collected_issues_are_reported_together(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[extra]\na=1\n"
        + BASE.replace('dataset = "tiny"', "dataset = 123")
        + 'branch = "has space"\ncommit_sha = "xyz"\nunknown = 1\n'
        + "[evaluation]\nbogus = 1\nn = 'x'\n"
        + "[env]\nNUM = 3\n"
        + SECRETS,
    )
    err = error_of(path)
    lines = err.message.splitlines()
    assert lines[0] == "Invalid eval config:"
    assert "  - extra: Unrecognized section" in lines
    assert "  - experiment.unknown: Unrecognized key" in lines
    assert "  - experiment.dataset: must be a string, got 123" in lines
    assert any(line.startswith("  - experiment.branch: is invalid: ") for line in lines)
    assert any(line.startswith("  - experiment.commit_sha: is invalid: ") for line in lines)
    assert any(line.startswith("  - experiment: is invalid: ") for line in lines)
    assert "  - evaluation.bogus: Unrecognized key" in lines
    assert "  - env.NUM: must be a string, got 3" in lines
    # Types inside [evaluation] are not checked at load time.
    assert not any("evaluation.n" in line for line in lines)
    assert err.details is not None
    assert err.details["error"] == "Invalid eval config"
    assert {"key": "env.NUM", "message": "must be a string, got 3"} in err.details["issues"]


def test_commit_sha_shapes(tmp_path: Path) -> None:
    ok = write(tmp_path, BASE + 'commit_sha = "abcDEF1"\n' + SECRETS)
    assert load_eval_config(ok).experiment.commit_sha == "abcDEF1"
    too_short = write(tmp_path, BASE + 'commit_sha = "abc12"\n' + SECRETS)
    assert "experiment.commit_sha: is invalid" in error_of(too_short).message


def config_with(evaluation: dict) -> EvalConfig:
    return EvalConfig(
        path=Path("x.toml"),
        experiment=ExperimentConfig("r", "main.py", "m/x", "d"),
        evaluation=evaluation,
    )


def test_run_spec_defaults_and_conversions() -> None:
    spec = resolve_run_spec(config_with({}))
    assert (spec.n, spec.pass_threshold, spec.batch_size, spec.limit) == (1, 1.0, None, None)
    assert spec.item_deadline_s == 3600.0
    spec = resolve_run_spec(
        config_with(
            {
                "pass_threshold": 0,
                "n": 3,
                "batch_size": -2,
                "agent_workflow_timeout_s": 10,
                "grader_timeout_s": 5.5,
                "limit": 7,
            }
        )
    )
    assert spec.pass_threshold == 0.0 and isinstance(spec.pass_threshold, float)
    assert (spec.n, spec.batch_size, spec.limit) == (3, -2, 7)
    assert spec.agent_timeout_sec == 10.0 and spec.grader_timeout_sec == 5.5
    assert spec.item_deadline_s == 75.5
    assert resolve_run_spec(config_with({"limit": 7}), limit_override=2).limit == 2


#: [evaluation] values resolve_run_spec refuses (also refused by the JSON Schema, but for the
#: exceptions its docstring names).
RUN_SPEC_ERRORS = [
    ({"pass_threshold": "1"}, "evaluation.pass_threshold must be a number, got '1'"),
    ({"pass_threshold": True}, "evaluation.pass_threshold must be a number, got True"),
    ({"pass_threshold": math.inf}, "evaluation.pass_threshold must be finite, got inf"),
    ({"n": 1.0}, "evaluation.n must be an integer, got 1.0"),
    ({"n": True}, "evaluation.n must be an integer, got True"),
    ({"n": 0}, "evaluation.n must be a positive integer, got 0"),
    ({"batch_size": "8"}, "evaluation.batch_size must be an integer, got '8'"),
    (
        {"agent_workflow_timeout_s": math.nan},
        "evaluation.agent_workflow_timeout_s must be finite, got nan",
    ),
    ({"grader_timeout_s": [1]}, "evaluation.grader_timeout_s must be a number, got [1]"),
    ({"limit": 2.5}, "evaluation.limit must be an integer, got 2.5"),
    # Order: pass_threshold is checked before n.
    ({"n": 0, "pass_threshold": "x"}, "evaluation.pass_threshold must be a number, got 'x'"),
]


@pytest.mark.parametrize(("evaluation", "message"), RUN_SPEC_ERRORS)
def test_run_spec_errors(evaluation: dict, message: str) -> None:
    with pytest.raises(CLIError) as info:
        resolve_run_spec(config_with(evaluation))
    assert info.value.message == message
