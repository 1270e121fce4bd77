"""The rollout SDK and the long-poll rollout server."""
