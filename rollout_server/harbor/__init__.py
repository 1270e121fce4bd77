"""The Harbor backend: rollouts as Harbor trials in sandboxes (podman, docker, cloud).

Import it explicitly (``from rollout_server.harbor import HarborBackend``); ``rollout_server``
itself never imports it. Harbor runs as a subprocess per trial, so this package needs only the
standard library and trio; Harbor itself comes from ``rollbridge[harbor]`` or the environment
``scripts/sandbox-testbed`` builds. With ``workflow=`` the rollout's own workflow and grader run
inside each trial's container (workflow mode: ``workflow.py``, ``placement.py`` and the
in-container runner ``rollout_server.sandbox``). See ``docs/harbor.md``.
"""

from __future__ import annotations

from .backend import HOST_SIDE_AGENTS, HarborBackend
from .locate import HarborSetupError, find_harbor

__all__ = ["HOST_SIDE_AGENTS", "HarborBackend", "HarborSetupError", "find_harbor"]
