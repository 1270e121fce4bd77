"""HarborBackend configuration and ``/health`` without podman: placement decides the URL need."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_server.backend import ExecutionRequest
from rollout_server.harbor import HarborBackend, HarborSetupError
from rollout_server.harbor.results import outcome_from_result
from rollout_server.protocol import RolloutErrorCategory, RolloutStatus
from tests.harbor.conftest import EXAMPLE

TASKS = EXAMPLE / "tasks"


def _backend(agent: str, **kwargs: object) -> HarborBackend:
    return HarborBackend(TASKS / "hello", agent=agent, reap_orphans=False, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("agent", "public"),
    [("oracle", False), ("nop", False), ("terminus-2", False), ("mini-swe-agent", True)],
)
def test_health_reports_the_reference_fields(agent: str, public: bool) -> None:
    health = _backend(agent, concurrency=3).health()
    assert health == {
        "status": "ok",
        "backend": "harbor",
        "agent": agent,
        "in_flight": 0,
        "running": 0,
        "queued": 0,
        "tearing_down": 0,
        "max_queue_depth": 1024,
        "chat_endpoint": {"environment": "podman", "requires_public_url": public},
    }


def test_template_mode_finds_the_one_task_and_dataset_rows_name_theirs(tmp_path: Path) -> None:
    assert _backend("oracle").template_task == TASKS / "hello"
    assert HarborBackend(TASKS, reap_orphans=False).template_task == TASKS / "hello"
    with pytest.raises(HarborSetupError):
        HarborBackend(tmp_path, reap_orphans=False)
    dataset = HarborBackend(TASKS, mode="dataset", reap_orphans=False)
    row = ExecutionRequest(id="r1", prompt=[], metadata={"harbor_task": "hello"})
    assert dataset._task_for(row) == TASKS / "hello"
    with pytest.raises(ValueError):
        dataset._task_for(ExecutionRequest(id="r2", prompt=[], metadata={"harbor_task": ".."}))


def test_terminus_config_carries_the_bridge_url_but_never_the_bearer(tmp_path: Path) -> None:
    backend = _backend("terminus-2", trials_root=tmp_path, model_name="openai/m")
    request = ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "do it"}])
    staged = backend._stage(request, "http://127.0.0.1:9/v1/rollouts/r1")
    config = staged.config
    document = json.loads(config.read_text())
    assert document["agent"]["kwargs"]["api_base"] == "http://127.0.0.1:9/v1/rollouts/r1"
    assert document["agent"]["model_name"] == "openai/m"
    assert (staged.staging / "task" / "instruction.md").read_text() == "do it\n"
    env = backend._child_env(["/x/bin/harbor"], "secret-bearer-1234", "http://u")
    assert env["OPENAI_API_KEY"] == "secret-bearer-1234"
    assert "secret-bearer-1234" not in config.read_text()


@pytest.mark.parametrize(
    ("kind", "workflow", "grader", "category"),
    [
        ("CancelledError", RolloutStatus.CANCELLED, None, None),
        ("AgentTimeoutError", RolloutStatus.FAILURE, None, RolloutErrorCategory.TIMEOUT),
        ("RuntimeError", RolloutStatus.FAILURE, None, RolloutErrorCategory.AGENT_ERROR),
        ("VerifierTimeoutError", RolloutStatus.SUCCESS, RolloutStatus.FAILURE, "timeout"),
        ("RewardFileNotFoundError", RolloutStatus.SUCCESS, RolloutStatus.FAILURE, "agent_error"),
    ],
)
def test_failure_categories_come_from_the_exception_type(
    kind: str, workflow: RolloutStatus, grader: RolloutStatus | None, category: str | None
) -> None:
    result = {"trial_name": "t", "exception_info": {"exception_type": kind}}
    outcome = outcome_from_result(result, prompt=[], label=None, grade=True)
    assert outcome.workflow.status == workflow
    assert (outcome.grader.status if outcome.grader else None) == grader
    assert outcome.reported().err_category == category


def test_reward_comes_from_the_reward_channel_only() -> None:
    good = {"verifier_result": {"rewards": {"reward": 1}}, "exception_info": None}
    outcome = outcome_from_result(good, prompt=[], label="x", grade=True)
    sample = outcome.reported().sample
    assert sample is not None
    assert sample.reward == 1.0
    other = {"verifier_result": {"rewards": {"score": 1}}, "exception_info": None}
    assert outcome_from_result(other, prompt=[], label=None, grade=True).reported().status == (
        RolloutStatus.FAILURE
    )


@pytest.mark.parametrize(
    ("kind", "phase"),
    [
        ("AgentTimeoutError", "agent"),
        ("AgentSetupTimeoutError", "agent"),
        ("RuntimeError", "agent"),
        ("SandboxBuildFailedError", "server"),
        ("VerifierTimeoutError", "grader"),
        ("RewardFileNotFoundError", "grader"),
    ],
)
def test_a_trial_failure_says_where_it_happened(kind: str, phase: str) -> None:
    """Issue 27 item 13: an agent timeout was labelled ``rollout:`` (no phase was recorded)."""
    result = {"trial_name": "t", "exception_info": {"exception_type": kind}}
    reported = outcome_from_result(result, prompt=[], label=None, grade=True).reported()
    assert reported.extra_fields is not None
    assert reported.extra_fields["failure"] == {"phase": phase, "type": kind}


def test_a_model_call_error_raised_in_a_host_side_agent_is_the_bridges() -> None:
    """terminus-2 calls the bridge through LiteLLM: an error answer is raised there as
    ``litellm.AuthenticationError: …`` and reported as the bridge's, with its status."""
    message = 'litellm.AuthenticationError: OpenAIException - {"error": {"message": "bad key"}}'
    failed = {"exception_type": "AuthenticationError", "exception_message": message}
    result = {"trial_name": "t", "exception_info": failed, "agent_setup": {}}
    reported = outcome_from_result(result, prompt=[], label=None, grade=True).reported()
    assert reported.extra_fields is not None
    assert reported.extra_fields["failure"] == {
        "phase": "bridge",
        "type": "AuthenticationError",
        "status": 401,
    }
    # The same name raised by something else (the agent's own code) stays the agent's.
    own = {"exception_type": "AuthenticationError", "exception_message": "ssh: key refused"}
    reported = outcome_from_result(
        {**result, "exception_info": own}, prompt=[], label=None, grade=True
    ).reported()
    assert reported.extra_fields is not None
    assert reported.extra_fields["failure"] == {"phase": "agent", "type": "AuthenticationError"}


def test_a_sandbox_that_could_not_be_built_is_the_servers_failure() -> None:
    """Harbor on podman raises a bare RuntimeError for a failed ``compose build``: that the
    agent never set up (only the environment's timing is there) is what says where it was."""
    setup = {"started_at": "2026-12-04T17:12:10Z", "finished_at": "2026-12-04T17:12:11Z"}
    failed = {"exception_type": "RuntimeError", "exception_message": "Docker compose failed"}
    result = {"trial_name": "t", "exception_info": failed, "environment_setup": setup}
    reported = outcome_from_result(
        {**result, "agent_setup": None, "agent_execution": None}, prompt=[], label=None, grade=True
    ).reported()
    assert reported.err_category == RolloutErrorCategory.INTERNAL_ERROR
    assert reported.extra_fields is not None
    assert reported.extra_fields["failure"] == {"phase": "server", "type": "RuntimeError"}
    ran = {**result, "agent_setup": setup, "agent_execution": setup}
    reported = outcome_from_result(ran, prompt=[], label=None, grade=True).reported()
    assert reported.err_category == RolloutErrorCategory.AGENT_ERROR
    assert reported.extra_fields is not None
    assert reported.extra_fields["failure"]["phase"] == "agent"


@pytest.mark.parametrize(
    ("eval_timeout", "shown", "warned"),
    [(400.0, 120.0, True), (30.0, 30.0, True), (120.0, 120.0, False), (None, 120.0, False)],
)
def test_the_tasks_own_agent_timeout_is_honoured(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    eval_timeout: float | None,
    shown: float | None,
    warned: bool,
) -> None:
    """Issue 27 item 14: the example task says ``[agent] timeout_sec = 120``; the eval's
    ``agent_workflow_timeout_s`` replaced it silently. The shorter applies, said once."""
    backend = _backend("oracle", trials_root=tmp_path)
    for n in range(2):
        request = ExecutionRequest(id=f"r{n}", prompt=[], agent_timeout_sec=eval_timeout)
        with caplog.at_level("WARNING", logger="rollout_server.harbor"):
            staged = backend._stage(request, "http://127.0.0.1:9/v1/rollouts/r")
        config = json.loads(staged.config.read_text())
        assert config["agent"].get("override_timeout_sec") == shown
    notes = [r.getMessage() for r in caplog.records if "timeout_sec" in r.getMessage()]
    if warned:
        assert notes == [
            f"task hello: the agent gets {shown:g} s: its own [agent] timeout_sec is 120 s, "
            f"the eval's agent_workflow_timeout_s {eval_timeout:g} s; the shorter applies"
        ]
    else:
        assert notes == []


@pytest.mark.parametrize(
    ("agent", "model", "expected_model", "key_env", "web_off"),
    [
        ("claude-code", None, "anthropic/rollbridge-model", "ANTHROPIC_API_KEY",
         {"disable_web_search": True}),
        ("claude-code", "anthropic/claude-sonnet-4-5", "anthropic/claude-sonnet-4-5",
         "ANTHROPIC_API_KEY", {"disable_web_search": True}),
        ("codex", "gpt-5", "openai/rollbridge-model", "OPENAI_API_KEY", {"web_search": "disabled"}),
    ],
)  # fmt: skip
def test_installed_agents_are_pointed_at_the_bridge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: str, model: str | None,
    expected_model: str, key_env: str, web_off: dict[str, object],
) -> None:  # fmt: skip
    """claude-code (Messages) and codex (Responses): the rollout URL as base_url, the bearer
    only as a ${...} template resolved from the Harbor child's environment, web tools off, and
    no other provider credential or base URL in that environment."""
    from rollout_server.harbor.installed import BEARER_ENV

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-ambient-0000000000")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    monkeypatch.setenv("GEMINI_API_KEY", "ambient-gemini-000000000000")
    backend = _backend(agent, trials_root=tmp_path, model_name=model)
    assert backend.health()["chat_endpoint"]["requires_public_url"] is True
    url = "https://bridge.example/v1/rollouts/r1"
    staged = backend._stage(
        ExecutionRequest(id="r1", prompt=[{"role": "user", "content": "x"}]), url
    )
    document = json.loads(staged.config.read_text())["agent"]
    assert document["base_url"] == url and document["model_name"] == expected_model
    assert document["env"] == {key_env: "${" + BEARER_ENV + "}"}
    assert {k: document["kwargs"][k] for k in web_off} == web_off
    env = backend._child_env(["/x/bin/harbor"], "secret-bearer-1234", url)
    assert env[BEARER_ENV] == "secret-bearer-1234"
    assert "ANTHROPIC_API_KEY" not in env and "ANTHROPIC_BASE_URL" not in env
    assert "GEMINI_API_KEY" not in env and "OPENAI_API_KEY" not in env
    assert "secret-bearer-1234" not in staged.config.read_text()


def test_other_agents_are_left_as_they_were(tmp_path: Path) -> None:
    backend = _backend("mini-swe-agent", trials_root=tmp_path, model_name="openai/m")
    staged = backend._stage(ExecutionRequest(id="r1", prompt=[]), "http://u/v1/rollouts/r1")
    document = json.loads(staged.config.read_text())["agent"]
    assert "base_url" not in document and "env" not in document
    env = backend._child_env(["/x/bin/harbor"], "secret-bearer-1234", "http://u")
    assert env["OPENAI_API_KEY"] == "secret-bearer-1234"


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_installed_agent_configs_validate_against_harbor(tmp_path: Path, agent: str) -> None:
    """The generated TrialConfig is one Harbor 0.25 accepts, with the fields read back as meant
    (``base_url``, ``env`` and the web-tool kwargs are real AgentConfig/agent fields)."""
    import subprocess

    from tests.harbor.conftest import HARBOR_VENV

    python = HARBOR_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"needs Harbor's venv at {HARBOR_VENV} (run scripts/sandbox-testbed)")
    backend = _backend(agent, trials_root=tmp_path)
    url = "https://bridge.example/v1/rollouts/r1"
    staged = backend._stage(ExecutionRequest(id="r1", prompt=[]), url)
    check = (
        "import json, sys\n"
        "from harbor.models.trial.config import TrialConfig\n"
        "a = TrialConfig.model_validate_json(open(sys.argv[1]).read()).agent\n"
        "print(json.dumps([a.name, a.model_name, a.base_url, a.env, a.kwargs]))\n"
    )
    done = subprocess.run(
        [str(python), "-c", check, str(staged.config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    name, model, base_url, env, kwargs = json.loads(done.stdout)
    assert (name, base_url) == (agent, url) and model.endswith("/rollbridge-model")
    assert list(env.values()) == ["${ROLLBRIDGE_AGENT_BEARER}"] and len(kwargs) == 1
