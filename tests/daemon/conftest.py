"""Daemon fixtures: the e2e workspace copy and shared rollout env (imported from the e2e
conftest so both suites sync the rollout environment once)."""

from tests.launcher.e2e.conftest import env, no_orphans, shared_env, workspace

__all__ = ["env", "no_orphans", "shared_env", "workspace"]
