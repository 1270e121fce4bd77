"""The rollbridge model bridge: an OpenAI-compatible endpoint for rollouts."""
