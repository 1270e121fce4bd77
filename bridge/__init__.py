"""The rollbridge model bridge: an OpenAI-compatible endpoint for rollouts.

Importing this package is cheap: quart, httpx and LiteLLM are imported only when a bridge
starts (LiteLLM only when the configured model needs it, on its own thread). It also holds the
project's one answer to "which values are secrets" (:mod:`rollout_server.net.secrets`), which the
launcher's redactor uses too.
"""

from bridge.errors import BridgeBindError, PreflightError
from bridge.preflight import preflight
from bridge.server import BridgeConfig, BridgeHandle, rollout_url, run_bridge
from bridge.upstreams.routing import OFFLINE_MODEL
from bridge.usage import RolloutUsage, UsageLedger
from rollout_server.net.secrets import (
    AMBIENT_MIN_LENGTH,
    KNOWN_SECRET_ENV_NAMES,
    REDACTED,
    secret_env_values,
)

__all__ = [
    "AMBIENT_MIN_LENGTH",
    "KNOWN_SECRET_ENV_NAMES",
    "OFFLINE_MODEL",
    "REDACTED",
    "BridgeBindError",
    "BridgeConfig",
    "BridgeHandle",
    "PreflightError",
    "RolloutUsage",
    "UsageLedger",
    "preflight",
    "rollout_url",
    "run_bridge",
    "secret_env_values",
]
