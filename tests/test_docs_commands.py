"""Every command block of the README and ``docs/`` (fenced ``bash``, ``sh``, ``shell`` or
``console``) is run by this test, literally, in a fresh directory outside the repository.

:data:`PLANS` says how each block runs: where (an empty directory, a workspace ``rollbridge
init`` wrote, a copy of ``examples/``), what has to exist first (runs the block names), and
which lines are left out and why (an install this environment already is). A block that needs
a component this machine may not have is skipped with the reason; a block with no plan, or a
plan with no block, fails :func:`test_every_command_block_has_a_plan`, so a new block in the
docs is run from the day it is written. A synopsis (``rollbridge bridge serve [--json] ...``)
is fenced ``text``: it is not a command.

In a ``console`` block the ``$`` lines are the commands; one ending in ``&`` starts in the
background, and the next command waits for its first output line, as a reader would.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(bash|sh|shell|console)[ \t]*\n(.*?)^```", re.M | re.S)
TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    """One fenced command block."""

    key: str  # "<file>: <its first line>", stable when lines move
    lang: str
    text: str


def _blocks() -> list[Block]:
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for match in FENCE.finditer(path.read_text(encoding="utf-8")):
            text = match.group(2)
            first = next(line for line in text.splitlines() if line.strip())
            found.append(Block(f"{path.relative_to(REPO)}: {first.strip()}", match.group(1), text))
    return found


Setup = Callable[[Path, dict[str, str]], Path]


@dataclass(frozen=True)
class Plan:
    """How one block runs: ``setup`` makes its directory (returns the cwd), ``edits`` replace
    text that cannot run here (each with its reason), ``skip`` names what is missing."""

    setup: Setup | None = None
    edits: tuple[tuple[str, str, str], ...] = ()
    needs: tuple[str, ...] = ()  # programs that must be on PATH
    skip: str | None = None
    slow: bool = True
    env: dict[str, str] = field(default_factory=dict)


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"


def _empty(tmp: Path, env: dict[str, str]) -> Path:
    return tmp


def _workspace(tmp: Path, env: dict[str, str]) -> Path:
    _run(["rollbridge", "init", "ws", "--rollout", "echo"], tmp, env)
    return tmp / "ws"


def _examples(tmp: Path, env: dict[str, str]) -> Path:
    """A copy of the repository's examples, its rollouts' SDK source pointed at this checkout."""
    shutil.copytree(
        REPO / "examples",
        tmp / "examples",
        ignore=shutil.ignore_patterns(".venv", "uv.lock", ".osmosis", "__pycache__"),
    )
    for pyproject in (tmp / "examples").glob("*/rollouts/*/pyproject.toml"):
        text = pyproject.read_text().replace('path = "../../../.."', f'path = "{REPO}"')
        pyproject.write_text(text)
    return tmp


def _with_runs(*names: str, copy_to: str | None = None) -> Setup:
    def setup(tmp: Path, env: dict[str, str]) -> Path:
        ws = _workspace(tmp, env)
        for name in names:
            _run(["rollbridge", "eval", "run", "configs/eval/echo.toml", "--yes", "--name", name],
                 ws, env)  # fmt: skip
        if copy_to is not None:
            shutil.copytree(ws / ".osmosis" / "evals" / names[0], ws / copy_to)
        return ws

    return setup


def _with_daemon(tmp: Path, env: dict[str, str]) -> Path:
    ws = _workspace(tmp, env)
    daemon = subprocess.Popen(
        ["rollbridge", "daemon", "--workspace", "."],
        cwd=ws,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _BACKGROUND.append(daemon)
    deadline = time.monotonic() + 60
    while not (ws / ".osmosis" / "daemon.json").is_file():
        assert daemon.poll() is None and time.monotonic() < deadline, "the daemon did not start"
        time.sleep(0.1)
    return ws


_BACKGROUND: list[subprocess.Popen[bytes]] = []

_INSTALLED = "this environment is that install (tests/launcher/test_packaging.py installs a wheel)"

PLANS: dict[str, Plan] = {
    'README.md: pip install -e ".[cli]" && rollbridge eval run examples/workspace/configs/eval/echo.toml --yes': Plan(
        _examples, edits=(('pip install -e ".[cli]" && ', "", _INSTALLED),)
    ),
    'README.md: pip install -e ".[dev]" && python -m pytest': Plan(
        skip="runs the whole test suite, this test included"
    ),
    'docs/eval-run.md: pip install -e ".[cli]"': Plan(
        _examples, edits=(('pip install -e ".[cli]"\n', "", _INSTALLED),)
    ),
    'docs/eval-run.md: eval "$(_ROLLBRIDGE_COMPLETE=bash_source rollbridge)"   # ~/.bashrc': Plan(
        _empty,
        edits=(
            ('eval "$(_ROLLBRIDGE_COMPLETE=zsh_source rollbridge)"', "true", "needs zsh"),
            ("_ROLLBRIDGE_COMPLETE=fish_source rollbridge | source", "true", "needs fish"),
        ),
        slow=False,
    ),
    "docs/report.md: rollbridge eval report calm-fox-12            # a run name under <workspace>/.osmosis/evals": Plan(
        _with_runs("calm-fox-12", copy_to="path/to/run/dir"), env={"BROWSER": "true"}
    ),
    "docs/report.md: rollbridge eval diff baseline candidate -o diff.html": Plan(
        _with_runs("baseline", "candidate")
    ),
    "docs/rollout-sdk.md: rollbridge init my-evals --rollout qa": Plan(_empty),
    "docs/rollout-sdk.md: cd rollouts/echo": Plan(
        skip="starts a rollout server on the fixed port 8000 that runs until stopped "
        "(tests/rollout_server serves the same SDK on port 0)"
    ),
    "docs/daemon.md: $ rollbridge init ws --rollout echo && cd ws": Plan(
        _empty,
        edits=(
            (
                "$ rollbridge ctl cancel demo --stage 1",
                "$ true",
                "needs a run still going: this workspace's 4 rows take about a second "
                "(tests/daemon cancels runs)",
            ),
        ),
    ),
    "docs/daemon.md: S=$(jq -r .socket .osmosis/daemon.json)": Plan(
        _with_daemon, needs=("jq", "curl")
    ),
    "docs/rubric.md: rollbridge eval rubric -d conversations.jsonl -r @rubric.md --model openai/gpt-4o-mini -o out/": Plan(
        skip="needs an OpenAI API key (a real judge model) and your conversations"
    ),
    "docs/scale-out.md: # shard k of N (k = 0 .. N-1) on machine k, each an ordinary local run; here N = 2:": Plan(
        _workspace
    ),
    "docs/scale-out.md: # once: a token for the cluster, copied to every node (keep it 0600)": Plan(
        skip="starts a Ray cluster on port 6379 and ends with `ray stop`, which stops every Ray "
        "process on the host (tests/cluster drive --ray on a two-node test bed; --ray alone: "
        "tests/cluster/test_flags.py, tests/cluster/test_join.py)"
    ),
    "docs/scale-out.md: # on the head node (the supervisor runs here), with the cluster's token settings:": Plan(
        skip="needs a Ray cluster and its token (tests/cluster drive --ray on a two-node test bed)"
    ),
    "docs/tunnel.md: # forward https://llm.example.com -> 127.0.0.1:8123 with your tool of choice, then:": Plan(
        skip="needs your own public tunnel to this machine"
    ),
}


def test_every_command_block_has_a_plan() -> None:
    keys = [b.key for b in _blocks()]
    assert len(keys) == len(set(keys)), "two blocks start with the same line in one file"
    assert sorted(set(keys) - set(PLANS)) == [], "add a plan to PLANS for each new block"
    assert sorted(set(PLANS) - set(keys)) == [], "a plan whose block is gone"
    for key, plan in PLANS.items():
        block = next(b for b in _blocks() if b.key == key)
        for old, _new, reason in plan.edits:
            assert old in block.text and reason, (key, old)


def _script(block: Block, plan: Plan) -> str:
    text = block.text
    for old, new, _reason in plan.edits:
        text = text.replace(old, new)
    return text


def _env(plan: Plan) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", PATH=f"{BIN}{os.pathsep}{env['PATH']}")
    env.update(plan.env)
    return env


def _console(text: str, cwd: Path, env: dict[str, str]) -> None:
    """Run the ``$`` lines one by one (``cd`` carried over); ``&`` starts one in the
    background, and the next waits for its first line of output."""
    for line in text.splitlines():
        if not line.startswith("$ "):
            continue
        command = line[2:].split("  #", 1)[0].strip()
        if command.endswith("&"):
            out = cwd / f".background-{len(_BACKGROUND)}.out"
            with out.open("wb") as sink:
                process = subprocess.Popen(
                    ["bash", "-c", command[:-1]],
                    cwd=cwd,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            _BACKGROUND.append(process)
            deadline = time.monotonic() + 60
            while not out.read_bytes().strip():
                assert process.poll() is None, f"{command}: {out.read_text()}"
                assert time.monotonic() < deadline, f"{command} printed nothing in 60 s"
                time.sleep(0.1)
            continue
        done = subprocess.run(
            ["bash", "-c", f"{command}\npwd"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        cwd = Path(done.stdout.splitlines()[-1])


@pytest.fixture
def background() -> Iterator[None]:
    yield
    while _BACKGROUND:
        process = _BACKGROUND.pop()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _params() -> Iterator[object]:
    for key, plan in PLANS.items():
        marks = [pytest.mark.slow] if plan.slow else []
        yield pytest.param(key, marks=marks, id=key.split(":")[0] + ":" + key[:60].split(": ")[1])


@pytest.mark.parametrize("key", list(_params()))
def test_the_block_runs(key: str, tmp_path: Path, background: None) -> None:
    plan = PLANS[key]
    if plan.skip is not None:
        pytest.skip(plan.skip)
    missing = [p for p in plan.needs if shutil.which(p) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH")
    if not (BIN / "rollbridge").is_file():
        pytest.skip("needs the rollbridge console script (pip install -e '.[cli]')")
    block = next(b for b in _blocks() if b.key == key)
    home = tmp_path / "user"
    home.mkdir()
    assert not home.resolve().is_relative_to(REPO.resolve())
    env = _env(plan)
    assert plan.setup is not None
    cwd = plan.setup(home, env)
    script = _script(block, plan)
    if block.lang == "console":
        _console(script, cwd, env)
        return
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
