"""The end-to-end fixtures (an example workspace copy, the shared synced rollout environment)
for ``eval run --upload``."""

from tests.launcher.e2e.conftest import env, shared_env, workspace

__all__ = ["env", "shared_env", "workspace"]
