"""A rollout that puts the run's secrets into its conversation, its metrics, an artifact and a
failure: no file of the run directory holds them afterwards (in any spelling the redaction policy
covers), ``eval export`` and ``eval report`` do not print them, and the rest of what the rollout
wrote is still there.

Two secrets: a provider key (a name the rollout server knows as a secret's) and a ``[secrets]``
value under a name that does not look like one (only the supervisor knows it is a secret)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from launcher.redact import Redactor
from launcher.rundir.projections import (
    project_item,
    read_valid_trajectory,
    redact_trial_files,
)
from launcher.rundir.records import TerminalRecord
from rollout_server.trajectory import environment_secrets, render_rollout_files
from tests.launcher.e2e.helpers import (
    base_env,
    make_workspace,
    run_cli,
    run_dir,
    synced_venv,
    write_config,
)

PROVIDER_KEY = "sk-test-SECRET123456"
PLAIN_NAMED = "conn-Plain-Named-Value-98765"

LEAKY = """
import base64
import os
from typing import Any

from main import EchoGrader
from rollout_server import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    LocalBackend,
    chat,
    reply_text,
    serve,
)


class LeakyWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext[Any]) -> AgentWorkflowOutput:
        key = os.environ["OPENAI_API_KEY"]
        conn = os.environ["DB_CONN"]
        messages = list(ctx.prompt)
        text = reply_text(await chat(messages))
        encoded = base64.b64encode(f"user:{key}".encode()).decode()
        reply = f"{text} KEEP-THIS-TAIL {key} {key.lower()} {encoded} {conn}"
        if ctx.artifacts_dir is not None:
            (ctx.artifacts_dir / "notes.txt").write_text(f"artifact-kept {key} {conn}\\n")
        return AgentWorkflowOutput(
            messages=[*messages, {"role": "assistant", "content": reply}],
            metrics={f"metric-kept {conn}": 1.0},
        )


class LeakyGrader(EchoGrader):
    async def grade(self, ctx):
        if ctx.metadata and ctx.metadata.get("explode"):
            raise ValueError(f"grader failed with {os.environ['OPENAI_API_KEY']}")
        await super().grade(ctx)


if __name__ == "__main__":
    serve(LocalBackend(workflow=LeakyWorkflow, grader=LeakyGrader))
"""

CONFIG = """
[experiment]
rollout = "echo"
entrypoint = "leaky.py"
model_path = "rollbridge/echo"
dataset = "echo.jsonl"

[evaluation]
batch_size = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30

[secrets]
required = ["OPENAI_API_KEY", "DB_CONN"]
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the example workspace with its rollout environment synced (uv)."""
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def env(tmp_path: Path, workspace: Path) -> dict[str, str]:
    """The CLI's environment, with the rollout's environment synced once."""
    venv = synced_venv(workspace / "rollouts" / "echo", tmp_path / "venv")
    return base_env(UV_PROJECT_ENVIRONMENT=str(venv))


def _needles() -> dict[str, bytes]:
    """The spellings of both secrets a file must not hold: as is, lower-case, base64 (of the
    value alone and inside ``user:<value>``)."""
    out: dict[str, bytes] = {}
    for value in (PROVIDER_KEY, PLAIN_NAMED):
        out[value] = value.encode()
        out[f"{value} lower"] = value.lower().encode()
        out[f"{value} base64"] = base64.b64encode(value.encode())
        core = base64.b64encode(f"user:{value}".encode())
        out[f"{value} base64 in user:"] = core[4:20]  # whole groups of the value's bytes
    return out


def _leaks(data: bytes) -> list[str]:
    return [name for name, needle in _needles().items() if needle in data]


@pytest.mark.slow
async def test_secrets_in_a_rollouts_output_never_reach_the_run_directory(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    (workspace / "rollouts" / "echo" / "leaky.py").write_text(LEAKY)
    write_config(workspace, "leaky", CONFIG)
    run_env = {**env, "OPENAI_API_KEY": PROVIDER_KEY, "DB_CONN": PLAIN_NAMED}

    result = await run_cli(
        [
            "eval",
            "run",
            "ws/configs/eval/leaky.toml",
            "--name",
            "leaky",
            "--yes",
            "--rows",
            "0-3,20",
        ],
        cwd=tmp_path,
        env=run_env,
    )
    assert not _leaks((result.stdout + result.stderr).encode()), result.stdout + result.stderr
    run = run_dir(workspace, "leaky")
    assert (run / "events.jsonl").is_file(), result.stdout + result.stderr

    leaked = {
        str(path.relative_to(run)): _leaks(path.read_bytes())
        for path in run.rglob("*")
        if path.is_file() and not path.is_symlink()
    }
    assert not {path: names for path, names in leaked.items() if names}

    # What is not a secret is all still there: the reply, its tail, the artifact, the metric.
    trajectories = sorted((run / "trajectories").glob("*.json"))
    assert trajectories
    text = trajectories[0].read_text()
    assert "KEEP-THIS-TAIL [REDACTED] [REDACTED]" in text
    assert "Repeat after me" in text
    trial_copies = list((run / "rollout_trials").glob("*/trajectory.json"))
    assert trial_copies and all("KEEP-THIS-TAIL" in p.read_text() for p in trial_copies)
    notes = list((run / "artifacts").glob("*/notes.txt"))
    assert notes and all(p.read_text().startswith("artifact-kept [REDACTED]") for p in notes)
    assert "metric-kept [REDACTED]" in (run / "events.jsonl").read_text()
    assert "metric-kept [REDACTED]" in (run / "index.jsonl").read_text()

    exported = await run_cli(["eval", "export", str(run), "-o", "-"], cwd=workspace, env=run_env)
    assert exported.returncode == 0, exported.stderr
    assert "KEEP-THIS-TAIL" in exported.stdout
    assert not _leaks((exported.stdout + exported.stderr).encode())

    report = tmp_path / "report.html"
    reported = await run_cli(
        ["eval", "report", str(run), "-o", str(report)], cwd=workspace, env=run_env
    )
    assert reported.returncode == 0, reported.stderr
    assert not _leaks(report.read_bytes() + (reported.stdout + reported.stderr).encode())


# -- the pieces, as plain functions -----------------------------------------------------------


def test_redact_bytes_returns_clean_bytes_themselves_and_redacts_every_spelling() -> None:
    redactor = Redactor([PROVIDER_KEY])
    clean = b'{"message": "nothing to see"}'
    assert redactor.redact_bytes(clean) is clean
    assert not redactor.found(clean.decode())
    encoded = base64.b64encode(f"user:{PROVIDER_KEY}".encode())
    data = f"a {PROVIDER_KEY.lower()} b ".encode() + encoded + b" c \xff"
    assert redactor.found(data.decode("utf-8", "surrogateescape"))
    assert redactor.redact_bytes(data) == b"a [REDACTED] b [REDACTED] c \xff"


def test_redact_json_bytes_keeps_a_document_valid() -> None:
    redactor = Redactor([PROVIDER_KEY])
    data = json.dumps({"m": f"x {json.dumps(PROVIDER_KEY)} y"}, indent=2).encode()
    clean = redactor.redact_json_bytes(data)
    assert json.loads(clean) == {"m": 'x "[REDACTED]" y'}
    # A value beginning with an escape's letter: the text's replacement would leave "\[", so
    # the strings are redacted instead, and only where the value really is.
    value = "nabc12345x"
    redactor = Redactor([value])
    data = json.dumps({"kept": "a\nabc12345x", "gone": value}).encode()
    assert json.loads(redactor.redact_json_bytes(data)) == {
        "kept": "a\nabc12345x",
        "gone": "[REDACTED]",
    }
    only_escape = json.dumps({"kept": "a\nabc12345x"}).encode()
    assert redactor.redact_json_bytes(only_escape) is only_escape


def _trial(tmp_path: Path, rollout_id: str, message: str) -> Path:
    trial = tmp_path / "run" / "rollout_trials" / rollout_id
    (trial / "artifacts" / "deep").mkdir(parents=True)
    doc = {"session_id": rollout_id, "steps": [{"message": message}]}
    (trial / "trajectory.json").write_text(json.dumps(doc, indent=2))
    return trial


def test_read_valid_trajectory_rewrites_a_file_holding_a_secret(tmp_path: Path) -> None:
    redactor = Redactor([PROVIDER_KEY])
    trial = _trial(tmp_path, "r1", f"reply {PROVIDER_KEY} tail")
    found = read_valid_trajectory(trial.parent, "r1", redactor=redactor)
    assert found is not None
    assert found.doc["steps"][0]["message"] == "reply [REDACTED] tail"
    on_disk = (trial / "trajectory.json").read_bytes()
    assert on_disk == found.data and PROVIDER_KEY.encode() not in on_disk
    assert os.stat(trial / "trajectory.json").st_mtime_ns == found.status.st_mtime_ns

    clean = _trial(tmp_path, "r2", "reply tail")
    before = os.stat(clean / "trajectory.json")
    found = read_valid_trajectory(clean.parent, "r2", redactor=redactor)
    assert found is not None and found.status.st_ino == before.st_ino  # not rewritten


def test_redact_trial_files_walks_the_trial_but_no_link(tmp_path: Path) -> None:
    redactor = Redactor([PLAIN_NAMED])
    trial = _trial(tmp_path, "r1", f"reply {PLAIN_NAMED}")
    (trial / "diagnostics.json").write_text(json.dumps({"failure": {"message": PLAIN_NAMED}}))
    (trial / "artifacts" / "deep" / "out.bin").write_bytes(b"\x00\xff" + PLAIN_NAMED.encode())
    outside = tmp_path / "outside.txt"
    outside.write_text(PLAIN_NAMED)
    (trial / "artifacts" / "link.txt").symlink_to(outside)
    redact_trial_files(trial, redactor, skip=frozenset({"trajectory.json"}))
    assert json.loads((trial / "diagnostics.json").read_text()) == {
        "failure": {"message": "[REDACTED]"}
    }
    assert (trial / "artifacts" / "deep" / "out.bin").read_bytes() == b"\x00\xff[REDACTED]"
    assert outside.read_text() == PLAIN_NAMED
    assert PLAIN_NAMED in (trial / "trajectory.json").read_text()  # skipped


def test_project_item_copies_only_redacted_files(tmp_path: Path) -> None:
    redactor = Redactor([PROVIDER_KEY])
    trial = _trial(tmp_path, "r1", f"reply {PROVIDER_KEY}")
    (trial / "artifacts" / "notes.txt").write_text(f"kept {PROVIDER_KEY}")
    run = tmp_path / "run"
    record = TerminalRecord(row_index=0, run_index=0, rollout_id="r1", status="success")
    trajectory = read_valid_trajectory(trial.parent, "r1", redactor=redactor)
    project_item(run, record, trajectory_valid=True, trajectory=trajectory, redactor=redactor)
    files = [p for p in run.rglob("*") if p.is_file()]
    assert len(files) == 4
    assert not [p for p in files if PROVIDER_KEY.encode() in p.read_bytes()]
    assert (run / "artifacts" / "row_0_run_0" / "notes.txt").read_text() == "kept [REDACTED]"
    assert "reply [REDACTED]" in (run / "trajectories" / "row_0_run_0.json").read_text()


def test_the_rollout_server_writes_no_secret_of_its_environment() -> None:
    assert environment_secrets({"HOME": "/home/me", "SHORT_TOKEN": "abc"}) is None
    secrets = environment_secrets({"OPENAI_API_KEY": PROVIDER_KEY, "DB_CONN": PLAIN_NAMED})
    assert secrets is not None
    trajectory = {"steps": [{"message": f"a {PROVIDER_KEY} {PLAIN_NAMED}"}]}
    files = render_rollout_files(
        trajectory=trajectory, diagnostics={"failure": {"m": PROVIDER_KEY}}, secrets=secrets
    )
    # DB_CONN's name says nothing of a secret: the supervisor redacts that one.
    assert json.loads(files["trajectory.json"]) == {
        "steps": [{"message": f"a [REDACTED] {PLAIN_NAMED}"}]
    }
    assert json.loads(files["diagnostics.json"]) == {"failure": {"m": "[REDACTED]"}}
    clean = {"steps": [{"message": "nothing"}]}
    assert render_rollout_files(trajectory=clean, diagnostics=None, secrets=secrets) == (
        render_rollout_files(trajectory=clean, diagnostics=None)
    )


def test_a_short_secret_inside_the_rollout_id_keeps_the_trajectory(tmp_path: Path) -> None:
    """A one-character [secrets] value occurs in the rollout's hex id: the id (ours, random,
    not secret) stays as written, so the trajectory is still the rollout's and is projected."""
    rollout_id = "00eb947a2e8a64d41b7749b9bd50e9dd"
    redactor = Redactor(["7"])
    trial = _trial(tmp_path, rollout_id, "count 7 items")
    found = read_valid_trajectory(trial.parent, rollout_id, redactor=redactor)
    assert found is not None
    assert found.doc["session_id"] == rollout_id
    assert found.doc["steps"][0]["message"] == "count [REDACTED] items"
    assert json.loads((trial / "trajectory.json").read_bytes()) == found.doc


def test_json_lines_artifacts_stay_json_lines(tmp_path: Path) -> None:
    value = "Xy7#kL9mQ2\\"  # ends with a backslash: its JSON spelling ends with an escape
    redactor = Redactor([value, "nabc12345x"])
    trial = _trial(tmp_path, "r1", "reply")
    records = [{"content": value + '"ok"'}, {"v": "x\nabc12345x"}, {"n": 1}]
    lines = [json.dumps(record) for record in records]
    (trial / "artifacts" / "conv.jsonl").write_text("\n".join(lines) + "\n")
    redact_trial_files(trial, redactor, skip=frozenset({"trajectory.json"}))
    written = (trial / "artifacts" / "conv.jsonl").read_text().split("\n")
    assert written[-1] == "" and len(written) == len(lines) + 1
    assert [json.loads(line) for line in written[:-1]] == [
        {"content": '[REDACTED]"ok"'},
        {"v": "x\nabc12345x"},  # no secret there: the match began with an escape's letter
        {"n": 1},
    ]
    assert written[1:3] == lines[1:3]  # lines without a secret are kept byte for byte
