"""Harbor's installed agents that call a model API themselves, pointed at the bridge.

``claude-code`` speaks Anthropic's Messages API and ``codex`` OpenAI's Responses API; the bridge
serves both on the rollout URL (docs/bridge.md, "Three APIs"), so neither needs a provider key.
For such an agent each trial's ``TrialConfig`` gets (Harbor 0.25's ``AgentConfig`` fields):

- ``base_url``: the rollout URL the trial was given (installed agents run in the container, so
  the run needs a URL the container reaches: ``requires_public_url`` in ``/health``);
- ``model_name``: the configured one when it has the provider prefix that makes Harbor pick the
  right API, else a neutral placeholder (the bridge answers with its own model whatever the name);
- ``env``: the agent's key variable as a ``${…}`` template naming :data:`BEARER_ENV`, which only
  the Harbor child process holds, so the bearer is never written into the config file;
- the agent's switch that turns provider-run web tools off (the bridge refuses them anyway).

The Harbor child's environment loses every other provider credential and base URL
(:func:`installed_env`), so the agent can reach no model but through the bridge.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BEARER_ENV", "INSTALLED_AGENTS", "installed_env", "wire_installed"]

#: The variable that carries the run's bearer into the Harbor child (never into a file).
BEARER_ENV = "ROLLBRIDGE_AGENT_BEARER"
PLACEHOLDER_MODEL = "rollbridge-model"
# Credentials and endpoints a provider SDK or CLI would pick up on its own.
_PROVIDER_ENV = re.compile(r"(_API_KEY|_AUTH_TOKEN|_API_BASE|_BASE_URL|_API_HOST|_HOST_URL)$")


@dataclass(frozen=True)
class InstalledAgent:
    """How one installed agent is pointed at the bridge."""

    provider: str
    """The model-name prefix that makes Harbor give the agent the right API."""
    key_env: str
    """The variable the agent reads its key from."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Agent kwargs that keep provider-run web tools off."""


INSTALLED_AGENTS: Mapping[str, InstalledAgent] = {
    "claude-code": InstalledAgent("anthropic", "ANTHROPIC_API_KEY", {"disable_web_search": True}),
    "codex": InstalledAgent("openai", "OPENAI_API_KEY", {"web_search": "disabled"}),
}


def wire_installed(
    agent_doc: dict[str, Any], agent: str, model_name: str | None, chat_url: str
) -> None:
    """Point an installed agent's ``AgentConfig`` document at the bridge (no-op for others)."""
    spec = INSTALLED_AGENTS.get(agent)
    if spec is None:
        return
    prefix = spec.provider + "/"
    named = model_name if model_name and model_name.startswith(prefix) else None
    agent_doc["model_name"] = named or prefix + PLACEHOLDER_MODEL
    agent_doc["base_url"] = chat_url
    env = dict(agent_doc.get("env") or {})
    env[spec.key_env] = "${" + BEARER_ENV + "}"
    agent_doc["env"] = env
    kwargs = agent_doc.setdefault("kwargs", {})
    for key, value in spec.kwargs.items():
        kwargs.setdefault(key, value)


def installed_env(env: Mapping[str, str], agent: str, bearer: str | None) -> dict[str, str]:
    """The Harbor child's environment for an installed agent: no provider credential or base
    URL but the bridge's, and the bearer in :data:`BEARER_ENV` (unchanged for other agents)."""
    if agent not in INSTALLED_AGENTS:
        return dict(env)
    out = {name: value for name, value in env.items() if not _PROVIDER_ENV.search(name)}
    if bearer:
        out[BEARER_ENV] = bearer
    return out
