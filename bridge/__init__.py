"""The rollbridge model bridge: an OpenAI-compatible endpoint for rollouts.

Importing this package is cheap: quart, httpx and LiteLLM are imported only when a bridge
starts (LiteLLM only when the configured model needs it, on its own thread).
"""

from bridge.errors import BridgeBindError, PreflightError
from bridge.preflight import preflight
from bridge.server import BridgeConfig, BridgeHandle, run_bridge
from bridge.upstreams.routing import OFFLINE_MODEL
from bridge.usage import RolloutUsage, UsageLedger

__all__ = [
    "OFFLINE_MODEL",
    "BridgeBindError",
    "BridgeConfig",
    "BridgeHandle",
    "PreflightError",
    "RolloutUsage",
    "UsageLedger",
    "preflight",
    "run_bridge",
]
