"""The in-sandbox runner: a rollout's workflow and grader, run inside a Harbor trial's container.

``python -m rollout_server.sandbox agent`` and ``python -m rollout_server.sandbox grade`` run
under the sandbox image's ``/opt/rollbridge/venv`` (see ``docs/harbor.md``). The files they
exchange with the host, all JSON:

``/logs/agent/container_input.json`` (written by the harness agent, deleted once read)
    ``rollout_id``, ``chat_completions_url`` (as the container dials it), ``api_key`` (the
    rollout's bearer), ``prompt`` (messages), ``metadata``, ``workflow`` and ``grader``
    (``"module:Qualname"``), ``config`` (JSON) with ``config_type`` (a dataclass's
    ``"module:Qualname"`` or ``null``), ``package_dir_name`` and ``timeout_sec``.
``/logs/agent/container_result.json`` (written by ``agent``)
    ``status`` (``success``/``failure``), ``messages``, ``metrics``, ``failure``
    (``{stage, type, message, detail}`` or ``null``).
``/tests/label.json`` (staged by the backend; Harbor uploads ``tests/`` only for verification)
    ``label``, ``metadata``, ``grader``, ``grader_config``, ``grader_config_type``,
    ``package_dir_name``.
``/logs/verifier/reward.json`` and ``/logs/verifier/grade_result.json`` (written by ``grade``)
    ``{"reward": r}`` for Harbor, and ``status``, ``reward``, ``remove_sample``, ``failure``
    for the backend.

This package imports nothing outside ``rollout_server`` and the base install, and the module
itself only the standard library, so the host side can read these names cheaply.
"""

from __future__ import annotations

from pathlib import PurePosixPath

__all__ = [
    "AGENT_COMMAND",
    "ARTIFACTS_DIR",
    "GRADE_COMMAND",
    "GRADE_RESULT_PATH",
    "INPUT_PATH",
    "LABEL_PATH",
    "RESULT_PATH",
    "REWARD_PATH",
    "VENV_PYTHON",
]

VENV_PYTHON = PurePosixPath("/opt/rollbridge/venv/bin/python")
AGENT_DIR = PurePosixPath("/logs/agent")
INPUT_PATH = AGENT_DIR / "container_input.json"
RESULT_PATH = AGENT_DIR / "container_result.json"
LABEL_PATH = PurePosixPath("/tests/label.json")
REWARD_PATH = PurePosixPath("/logs/verifier/reward.json")
GRADE_RESULT_PATH = PurePosixPath("/logs/verifier/grade_result.json")
ARTIFACTS_DIR = PurePosixPath("/logs/artifacts")
AGENT_COMMAND = f"{VENV_PYTHON} -m rollout_server.sandbox agent"
GRADE_COMMAND = f"{VENV_PYTHON} -m rollout_server.sandbox grade"
