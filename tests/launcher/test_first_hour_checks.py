"""Mistakes of a first hour with ``rollbridge eval run`` that are refused at once, each in one
line: a model name that names no model, a key in ``[env]`` (it would land in manifest.json),
timeouts that fail every row, a provider key no request can carry, datasets that broke the
read for an unused column or an overlong number, a config that is not there, and a ``uv
sync`` whose error named neither the URL nor the package that failed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from launcher.cli import main
from launcher.config import load_eval_config, resolve_run_spec
from launcher.dataset import select_rows
from launcher.early_checks import check_model_key
from launcher.errors import CLIError, DependencyError
from launcher.rollout_env import uv_sync
from launcher.workspace import resolve_workspace
from tests.launcher.test_cli_bad_input import ws as ws  # a fixture, used by name

KEY = "sk-test-SECRETVALUE123"
HEAD = """[experiment]
rollout = "echo"
entrypoint = "main.py"
model_path = "rollbridge/echo"
dataset = "echo.jsonl"
"""
SECRETS = "[secrets]\nrequired = []\n"


def _one_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The single ``Error:`` line ``rollbridge`` prints for ``args`` (exit code 1)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    _, err = capsys.readouterr()
    assert exc.value.code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err
    return lines[0]


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


def _message(path: Path) -> str:
    with pytest.raises(CLIError) as info:
        resolve_run_spec(load_eval_config(path))
    assert "\n" not in info.value.message
    return info.value.message


# --- the model ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("", "the model name is empty; write provider/model, for example openai/gpt-4o-mini"),
        ("   ", "the model name is empty"),
        ("openai/", "'openai/' names no model after the provider; write provider/model"),
        ("openrouter/x/", "'openrouter/x/' names no model after the provider"),
        ("/gpt-4o", "'/gpt-4o' names no provider before the model"),
        ("openrouter//x", "'openrouter//x' has an empty name between two slashes"),
        (
            "rollbridge/nope",
            "'rollbridge/nope' is not a model: the only rollbridge/ model is rollbridge/echo "
            "(offline, no key)",
        ),
    ],
)
def test_a_model_path_that_names_no_model_is_refused_at_load(
    tmp_path: Path, model: str, expected: str
) -> None:
    path = _config(tmp_path, HEAD.replace('"rollbridge/echo"', json.dumps(model)) + SECRETS)
    message = _message(path)
    assert message.startswith(f"Invalid model_path in [experiment] of {path}: ")
    assert expected in message
    with pytest.raises(CLIError, match=r"^model preflight failed for "):
        check_model_key(model, str)


@pytest.mark.parametrize("model", ["gpt-4o", "openai/gpt-4o-mini", "rollbridge/echo"])
def test_a_model_path_that_names_a_model_loads(tmp_path: Path, model: str) -> None:
    path = _config(tmp_path, HEAD.replace("rollbridge/echo", model) + SECRETS)
    assert load_eval_config(path).experiment.model_path == model


def test_an_empty_model_path_is_one_line_before_anything_starts(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(config.read_text().replace('"rollbridge/echo"', '""'))
    line = _one_error(capsys, "eval", "run", "configs/eval/echo.toml", "--yes")
    assert "Invalid model_path in [experiment]" in line and "the model name is empty" in line
    assert not (ws / ".osmosis").exists()


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("sk-test-\nSECRET", "a line break or other control character"),
        ("sk-test-\rSECRET", "a line break or other control character"),
        ("sk-test-\tSECRET", "a line break or other control character"),
        ("sk-test-\x7fSECRET", "a line break or other control character"),
        ("sk-test-\u201cSECRET", "non-ASCII characters"),
    ],
)
def test_a_provider_key_no_header_can_carry_is_named_never_shown(
    monkeypatch: pytest.MonkeyPatch, value: str, what: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", value)
    with pytest.raises(CLIError) as info:
        check_model_key("openai/gpt-4o-mini", str)
    message = info.value.message
    assert message.startswith(
        f"model preflight failed for 'openai/gpt-4o-mini': OPENAI_API_KEY contains {what}"
    )
    assert "SECRET" not in message and "\n" not in message


def test_a_multi_line_key_in_the_secrets_file_stops_the_run_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(config.read_text().replace("rollbridge/echo", "openai/gpt-4o-mini"))
    (ws / "ml.env").write_text('OPENAI_API_KEY="sk-test-\nSECRETVALUE123"\n')
    line = _one_error(
        capsys, "eval", "run", "configs/eval/echo.toml", "--yes", "--secrets-file", "ml.env"
    )
    assert "OPENAI_API_KEY contains a line break or other control character" in line
    assert "SECRETVALUE123" not in line


# --- [env] -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "MY_TOOL_TOKEN", "DB_PASSWORD", "KEY_REPORT"])
def test_a_secret_in_env_is_refused_naming_it_not_its_value(tmp_path: Path, name: str) -> None:
    path = _config(tmp_path, HEAD + f'[env]\n{name} = "{KEY}"\n' + SECRETS)
    message = _message(path)
    assert message == (
        f"{name} in [env] of {path} names a secret, and [env] values are recorded in "
        f"manifest.json: remove it from [env] and list {name} in [secrets].required"
    )
    assert KEY not in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LOG_LEVEL", "info"),
        ("TOKENIZERS_PARALLELISM", "false"),  # a short value is no key
        ("MAX_TOKENS", "4096"),
        ("GOOGLE_APPLICATION_CREDENTIALS_FILE", "/etc/creds.json"),
        ("RAY_AUTH_TOKEN_PATH", "~/token"),
        ("OSMOSIS_TOKEN_PLATFORM_URL", "https://platform.example/api"),
    ],
)
def test_env_entries_that_hold_no_secret_load(tmp_path: Path, name: str, value: str) -> None:
    path = _config(tmp_path, HEAD + f'[env]\n{name} = "{value}"\n' + SECRETS)
    assert load_eval_config(path).env == {name: value}


def test_a_key_in_env_never_reaches_a_run_directory(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(HEAD + f'[env]\nOPENAI_API_KEY = "{KEY}"\n' + SECRETS)
    line = _one_error(capsys, "eval", "run", "configs/eval/echo.toml", "--yes", "--name", "k")
    assert "OPENAI_API_KEY in [env]" in line and KEY not in line
    assert not (ws / ".osmosis").exists()


# --- [evaluation] ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["agent_workflow_timeout_s", "grader_timeout_s"])
@pytest.mark.parametrize("value", ["0", "-1", "-0.5", "0.0"])
def test_a_timeout_that_fails_every_row_is_refused(tmp_path: Path, key: str, value: str) -> None:
    path = _config(tmp_path, HEAD + f"[evaluation]\n{key} = {value}\n" + SECRETS)
    assert _message(path) == (
        f"evaluation.{key} must be a positive number of seconds, got {value} "
        "(leave it out for no timeout)"
    )


def test_a_positive_timeout_is_kept(tmp_path: Path) -> None:
    text = HEAD + "[evaluation]\nagent_workflow_timeout_s = 0.5\ngrader_timeout_s = 2\n" + SECRETS
    spec = resolve_run_spec(load_eval_config(_config(tmp_path, text)))
    assert (spec.agent_timeout_sec, spec.grader_timeout_sec) == (0.5, 2.0)


# --- datasets ----------------------------------------------------------------------------


def test_an_unused_nanosecond_timestamp_column_does_not_fail_a_parquet_read(
    tmp_path: Path,
) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "ts.parquet"
    created = pa.array([1, 2], pa.timestamp("ns"))  # as pandas writes datetime64[ns]
    pq.write_table(
        pa.table({"user_prompt": ["a", "b"], "ground_truth": ["x", "y"], "created": created}),
        path,
    )
    rows = select_rows(path).rows
    assert [(r.user_prompt, r.label) for r in rows] == [("a", "x"), ("b", "y")]


def test_a_used_column_that_cannot_convert_is_named(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "ts.parquet"
    pq.write_table(
        pa.table({"user_prompt": ["a"], "ground_truth": pa.array([1], pa.timestamp("ns"))}), path
    )
    with pytest.raises(CLIError) as info:
        select_rows(path)
    message = info.value.message
    assert message.startswith(f"{path}: column 'ground_truth' cannot be converted (")
    assert message.endswith("; store it as a string")
    assert "pandas" not in message and "\n" not in message


def test_a_parquet_file_without_a_row_column_still_counts_its_rows(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"]}), path)
    with pytest.raises(CLIError, match="row 0: user_prompt is required"):
        select_rows(path)
    with pytest.raises(CLIError, match=r"--rows selects \[2\] but other\.parquet has 2 rows"):
        select_rows(path, rows="2")


def test_an_overlong_integer_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    huge = "9" * 5000
    path.write_text(
        '{"user_prompt": "x", "ground_truth": "x"}\n'
        f'{{"user_prompt": "x", "ground_truth": "x", "metadata": {{"n": {huge}}}}}\n'
    )
    with pytest.raises(CLIError) as info:
        select_rows(path)
    assert info.value.message == (
        f"{path}:2: holds an integer too long to read "
        f"(over {sys.get_int_max_str_digits()} digits); store it as a string"
    )


def test_an_overlong_integer_in_a_csv_metadata_cell_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    path.write_text('user_prompt,metadata\nx,"{""n"": ' + "9" * 5000 + '}"\n')
    with pytest.raises(CLIError, match=r"^row 0: metadata holds an integer too long to read"):
        select_rows(path)


# --- the config file and uv sync ---------------------------------------------------------


def test_a_config_that_does_not_exist_says_so_first(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent.toml"
    with pytest.raises(CLIError) as info:
        resolve_workspace(missing, tmp_path)
    assert info.value.message == f"Config file not found: {missing}"


UV_TIMEOUT = """#!/bin/sh
echo "Resolved 3 packages"
echo "error: Request failed after 3 retries in 124.7s"
echo "  cause: Failed to fetch: http://127.0.0.1:9/simple/requests/"
echo "  cause: error sending request for url (http://127.0.0.1:9/simple/requests/)"
echo "  cause: operation timed out"
exit 2
"""
UV_UNSOLVABLE = """#!/bin/sh
echo "error: Failed to fetch: http://127.0.0.1:9/simple/old/"
echo "error: No solution found when resolving dependencies"
echo "  cause: Because nope was not found in the package registry, we are stuck."
exit 1
"""
# uv 0.13's own words, offline with a cold cache: the last line is a hint, not the error.
UV_OFFLINE = """#!/bin/sh
echo "Using CPython 3.11.7 interpreter at: /usr/bin/python3"
echo "error: No solution found when resolving dependencies"
echo "  cause: Because h11 was not found in the cache and your project depends on h11, we can"
echo "  conclude that your project's requirements are unsatisfiable."
echo ""
echo "hint: Packages were unavailable because the network was disabled. When the network is \
disabled, registry packages may only be read from the cache."
exit 1
"""
# An interpreter that fails to answer: uv quotes its stderr after the error's causes.
UV_SHIM = """#!/bin/sh
echo "error: Failed to inspect Python interpreter from search path at /x/shims/python3.12"
echo "  Caused by: Querying Python at /x/shims/python3.12 failed with exit status 127"
echo ""
echo "[stderr]"
echo "pyenv: python3.12: command not found"
echo ""
echo "Note: See 'pyenv help global' for tips on allowing both"
echo "      python2 and python3 to be found at the same time."
exit 2
"""
# Drawn as a tree (uv's output to a terminal).
UV_TREE = """#!/bin/sh
echo "  × No solution found when resolving dependencies:"
echo "  ╰─▶ Because nope was not found in the package registry and your project"
echo "      depends on nope, we can conclude that your project's requirements are"
echo "      unsatisfiable."
exit 1
"""


def _failing_uv(tmp_path: Path, script: str) -> tuple[Path, Path]:
    """A stand-in uv running ``script`` and a rollout for it: ``(uv, rollout_dir)``."""
    uv = tmp_path / "uv"
    uv.write_text(script)
    uv.chmod(0o755)
    rollout = tmp_path / "rollouts" / "echo"
    rollout.mkdir(parents=True)
    (rollout / "pyproject.toml").write_text('[project]\nname = "r"\nversion = "0"\n')
    return uv, rollout


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (
            UV_TIMEOUT,
            "exit code 2: Failed to fetch: http://127.0.0.1:9/simple/requests/: "
            "operation timed out\n",
        ),
        (
            UV_UNSOLVABLE,
            "exit code 1: Because nope was not found in the package registry, we are stuck.\n",
        ),
        (
            UV_OFFLINE,
            "exit code 1: Because h11 was not found in the cache and your project depends on "
            "h11, we can conclude that your project's requirements are unsatisfiable. (hint: "
            "Packages were unavailable because the network was disabled)\n",
        ),
        (
            UV_SHIM,
            "exit code 2: Failed to inspect Python interpreter from search path at "
            "/x/shims/python3.12: Querying Python at /x/shims/python3.12 failed with exit "
            "status 127\n",
        ),
        (
            UV_TREE,
            "exit code 1: Because nope was not found in the package registry and your project "
            "depends on nope, we can conclude that your project's requirements are "
            "unsatisfiable.\n",
        ),
    ],
)
async def test_a_failed_uv_sync_names_what_failed(tmp_path: Path, script: str, said: str) -> None:
    uv, rollout = _failing_uv(tmp_path, script)
    with trio.fail_after(20), pytest.raises(DependencyError) as raised:
        await uv_sync(
            uv,
            rollout,
            "echo",
            env={"PATH": "/usr/bin:/bin"},
            sink=lambda line: None,
            logs_hint="logs.txt",
            redact=lambda text: text.replace("127.0.0.1:9", "[REDACTED]"),
        )
    expected = said.replace("127.0.0.1:9", "[REDACTED]")
    assert str(raised.value) == (f"uv sync failed for rollouts/echo with {expected}Logs: logs.txt")


@pytest.mark.parametrize("value", [0, -3])
def test_a_batch_size_of_0_or_less_is_ignored_with_a_warning(
    ws: Path, capsys: pytest.CaptureFixture[str], value: int
) -> None:
    """The reference ignores it (docs/spec/supervisor.md §1.3): now it says so."""
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(config.read_text().replace("batch_size = ", f"batch_size = {value}  # "))
    with pytest.raises(SystemExit) as exc:  # --rows out of range: stops once prepared
        main(["eval", "run", "configs/eval/echo.toml", "--yes", "--plain", "--rows", "999"])
    _, err = capsys.readouterr()
    assert exc.value.code == 1
    assert (
        f"evaluation.batch_size = {value} is ignored (0 or less, as osmosis-ai reads it): "
        "concurrency comes from --max-in-flight, else the rollout server's capacity"
    ) in err
    assert "Traceback" not in err


async def test_a_failed_sync_says_why_no_wheel_of_rollbridge_was_offered(tmp_path: Path) -> None:
    """The cause a user must fix (a cache it cannot write) is not uv's "rollbridge was not
    found in the package registry": both are said, in the one error line."""
    uv, rollout = _failing_uv(tmp_path, UV_UNSOLVABLE)
    why = "cannot make a wheel of the running rollbridge: [Errno 30] Read-only file system"
    with trio.fail_after(20), pytest.raises(DependencyError) as raised:
        await uv_sync(
            uv,
            rollout,
            "echo",
            env={"PATH": "/usr/bin:/bin", "UV_PYTHON": "x"},
            sink=lambda line: None,
            logs_hint="logs.txt",
            redact=lambda text: text,
            no_wheel=why,
        )
    first = str(raised.value).splitlines()[0]
    assert first.endswith(f"we are stuck. (no wheel of the running rollbridge to offer it: {why})")


def test_a_config_s_auto_address_without_a_cluster_names_the_config(
    ws: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``[ray] address = "auto"`` with no cluster on this machine: the error names what the
    user wrote (the config), not a ``--ray`` flag they did not pass."""
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(config.read_text() + '\n[ray]\naddress = "auto"\n')
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray-here"))
    with pytest.raises(SystemExit) as exc:
        main(["eval", "run", "configs/eval/echo.toml", "--yes", "--plain"])
    _, err = capsys.readouterr()
    assert exc.value.code == 1
    assert err.startswith(
        'Error: [ray] address = "auto" joins this machine\'s Ray cluster, and there is none'
    ), err


def test_ray_settings_of_a_local_run_are_said_to_be_unused(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ws / "configs" / "eval" / "echo.toml"
    config.write_text(config.read_text() + "\n[ray]\nmin_replicas = 2\n")
    with pytest.raises(SystemExit):  # an empty shard: refused right after the [ray] settings
        main(["eval", "run", "configs/eval/echo.toml", "--yes", "--plain", "--shard", "30/40"])
    _, err = capsys.readouterr()
    assert "[ray] min_replicas of the config apply only to a run on Ray" in err, err


def test_a_missing_ray_token_file_is_refused_before_anything_starts(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray", reason="needs Ray (the rollbridge[ray] extra)")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "gone"))
    with pytest.raises(SystemExit) as exc:
        main(
            ["eval", "run", "configs/eval/echo.toml", "--yes", "--plain", "--ray", "10.0.0.1:6379"]
        )
    _, err = capsys.readouterr()
    assert exc.value.code == 1
    assert err.startswith(f"Error: --ray: RAY_AUTH_TOKEN_PATH names {tmp_path / 'gone'}"), err
    assert not (ws / ".osmosis" / "evals").exists() or not any(
        (ws / ".osmosis" / "evals").iterdir()
    )
