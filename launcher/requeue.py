"""What a cluster transport raises when a rollout's replica is lost (launcher.cluster)."""

from __future__ import annotations

__all__ = ["RolloutLost"]


class RolloutLost(Exception):
    """The replica running this rollout was lost (its node left, its actor died): nothing of
    the attempt is recorded, and :class:`~launcher.dispatch.Dispatcher` puts the item back at
    the front of its queue, to run again under a new rollout id. Never raised in a local run."""
