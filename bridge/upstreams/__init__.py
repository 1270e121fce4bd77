"""Where the bridge sends a call: the offline echo model, an OpenAI-compatible upstream called
directly, or LiteLLM on its own asyncio loop thread."""
