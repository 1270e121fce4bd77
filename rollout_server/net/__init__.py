"""The shared HTTP floor: plumbing any package of rollbridge may import.

It depends only on the light base install (trio, hypercorn, httpx, h11) and imports nothing
else of the project, so the rollout SDK, the bridge and the launcher can all stand on it.
"""
