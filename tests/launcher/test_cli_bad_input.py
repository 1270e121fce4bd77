"""Bad input to ``rollbridge eval run`` that is caught before anything starts: one ``Error:``
line on stderr, exit code 1, no traceback, and no run directory created or changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launcher.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workspace"


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(
        EXAMPLE, root, ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__")
    )
    monkeypatch.chdir(root)
    return root


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: "), err
    assert "Traceback" not in err
    return lines[0]


CONFIG = "configs/eval/echo.toml"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tunnel", "ngrok"], "--tunnel supports only 'cloudflared', got 'ngrok'"),
        (
            ["--tunnel", "cloudflared", "--advertise-url", "https://x.example"],
            "--tunnel and --advertise-url are mutually exclusive",
        ),
        (["--listener-port", "70000"], "--listener-port must be between 1 and 65535, got 70000"),
        (
            ["--advertise-url", "https://x.example/p?q=1", "--listener-port", "4000"],
            "--advertise-url must be an http(s) base URL",
        ),
        (["--advertise-url", "https://x.example"], "--advertise-url requires --listener-port"),
        (["--rows", "3, 7"], "--rows must be comma-separated indices or ranges"),
        (["--rows", "9-2"], "--rows range '9-2' is inverted; write it as 2-9"),
        (["--rows", "5,400"], "--rows selects [400] but echo.jsonl has 21 rows"),
        (["--name", "../x"], "run name must be a single path segment"),
        (["--name", ".locks"], "run name '.locks' is reserved"),
        (["--max-in-flight", "0"], "--max-in-flight must be a positive integer, got 0"),
        (["--limit", "0"], "--limit must be a positive integer, got 0"),
        (["--limit", "-2"], "--limit must be a positive integer, got -2"),
        (["--dataset-file", "nope.jsonl"], "--dataset-file nope.jsonl is not a file"),
    ],
)
def test_bad_flags(
    ws: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    code, _, err = _run(capsys, "eval", "run", CONFIG, "--yes", *args)
    assert code == 1
    assert expected in _one_error(err)
    assert not (ws / ".osmosis" / "evals").exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[experiment\n", "Invalid TOML in"),
        ("[experiment]\nrollout = 'echo'\n", "Missing 'entrypoint' in [experiment] section"),
        (
            "[experiment]\nrollout='echo'\nentrypoint='main.py'\nmodel_path='m/x'\n"
            "dataset='echo'\n[secrets]\nrequired=[]\n[weird]\nx=1\n",
            "weird: Unrecognized section",
        ),
        (
            "[experiment]\nrollout='echo'\nentrypoint='main.py'\nmodel_path='m/x'\n"
            "dataset='echo'\n[evaluation]\nn=0\n[secrets]\nrequired=[]\n",
            "evaluation.n must be a positive integer, got 0",
        ),
        (
            "[experiment]\nrollout='echo'\nentrypoint='main.py'\nmodel_path='m/x'\n"
            "dataset='echo'\n",
            "Missing [secrets] section in",
        ),
        (
            "[experiment]\nrollout='../x'\nentrypoint='main.py'\nmodel_path='m/x'\n"
            "dataset='echo'\n[secrets]\nrequired=[]\n",
            "must be a single-segment name",
        ),
    ],
)
def test_bad_config(
    ws: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    (ws / "configs" / "eval" / "bad.toml").write_text(content)
    code, _, err = _run(capsys, "eval", "run", "configs/eval/bad.toml", "--yes")
    assert code == 1
    assert expected in _one_error(err)


def test_config_outside_a_workspace(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ws / "elsewhere.toml").write_text("[experiment]\n")
    code, _, err = _run(capsys, "eval", "run", "elsewhere.toml", "--yes")
    assert code == 1
    assert "must live under <workspace>/configs/eval/" in _one_error(err)


def test_missing_config_file(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "eval", "run", "configs/eval/nothere.toml", "--yes")
    assert code == 1
    assert "Config file not found" in _one_error(err)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json\n", "echo.jsonl:22: invalid JSON"),
        ('["a list"]\n', "echo.jsonl:22: each line must be a JSON object"),
        ('{"user_prompt": "no label"}\n', "row 21: ground_truth (or label) is required"),
    ],
)
def test_bad_dataset_rows(
    ws: Path, capsys: pytest.CaptureFixture[str], line: str, expected: str
) -> None:
    with open(ws / "data" / "echo.jsonl", "a") as fh:
        fh.write(line)
    code, _, err = _run(capsys, "eval", "run", CONFIG, "--yes")
    assert code == 1
    assert expected in _one_error(err)


def test_json_mode_prints_an_error_envelope(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "eval", "run", CONFIG, "--json", "--rows", "x")
    assert code == 1
    envelope = json.loads(out)
    assert envelope["status"] == "error"
    assert envelope["error"]["code"] == "VALIDATION"
    assert "--rows must be comma-separated" in envelope["error"]["message"]
    assert err == ""


def test_error_messages_are_redacted(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-this-is-a-planted-key-1234"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    code, _, err = _run(capsys, "eval", "run", CONFIG, "--yes", "--rows", secret)
    assert code == 1
    line = _one_error(err)
    assert secret not in line and "[REDACTED]" in line


def test_flag_parse_errors_are_redacted_too(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-another-planted-key-5678"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    code, _, err = _run(capsys, "eval", "run", CONFIG, "--max-in-flight", secret)
    assert code == 2  # a usage error: click's usage line, then the one Error: line
    line = err.splitlines()[-1]
    assert line.startswith("Error: ")
    assert secret not in err and secret not in line and "[REDACTED]" in line


def test_a_rollout_that_is_not_there_is_named_before_anything_is_made(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = (ws / CONFIG).read_text()
    (ws / "configs" / "eval" / "nope.toml").write_text(
        config.replace('rollout = "echo"', 'rollout = "nope"')
    )
    code, _, err = _run(capsys, "eval", "run", "configs/eval/nope.toml", "--yes")
    assert code == 1
    line = _one_error(err)
    assert "rollout directory" in line and "rollouts/nope does not exist" in line
    assert line.endswith("check experiment.rollout; rollouts/ holds echo")
    assert not (ws / ".osmosis" / "evals").exists()
    (ws / "configs" / "eval" / "noentry.toml").write_text(
        config.replace('entrypoint = "main.py"', 'entrypoint = "missing.py"')
    )
    code, _, err = _run(capsys, "eval", "run", "configs/eval/noentry.toml", "--yes")
    assert code == 1 and "missing.py does not exist" in _one_error(err)
    assert not (ws / ".osmosis" / "evals").exists()


def test_an_output_root_that_cannot_hold_a_lock_is_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = ws / "out"
    root.mkdir()
    (root / ".locks").write_text("a file where the locks' directory goes")
    code, _, err = _run(capsys, "eval", "run", CONFIG, "--yes", "-o", "out", "--name", "x")
    assert code == 1
    line = _one_error(err)
    assert line.startswith("Error: cannot lock run 'x' under the output root"), line
    assert not (root / "x").exists()


def test_init_onto_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "afile"
    target.write_text("mine")
    code, _, err = _run(capsys, "init", str(target))
    assert code == 1
    assert _one_error(err) == f"Error: {target} exists and is not a directory; choose another DIR"
    assert target.read_text() == "mine"


def test_a_secrets_files_values_are_redacted_from_the_first_error(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value known only from --secrets-file (not in the environment) in an error raised
    before the run's services read that file: redacted all the same."""
    secret = "sk-test-AbCdEf0123456789XyZ"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (ws / "keys.env").write_text(f"OPENAI_API_KEY={secret}\n")
    code, _, err = _run(
        capsys, "eval", "run", CONFIG, "--yes", "--secrets-file", "keys.env", "--rows", secret
    )
    assert code == 1
    line = _one_error(err)
    assert secret not in err and "[REDACTED]" in line
    # A file that cannot be read is said by the services' own read, as before (not here).
    code, _, err = _run(
        capsys, "eval", "run", CONFIG, "--yes", "--secrets-file", "missing.env", "--rows", "x"
    )
    assert code == 1 and "--rows" in _one_error(err)
