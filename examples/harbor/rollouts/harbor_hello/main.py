"""Harbor rollout: every row is one Harbor trial of ``tasks/hello`` in a podman sandbox.

Template mode: the row's prompt becomes the task's instruction; the task's own tests grade the
result. The eval config picks the agent through ``[env]`` (``HARBOR_AGENT``: ``oracle``, ``nop``
or ``terminus-2``) and the number of trials at once (``HARBOR_CONCURRENCY``).
"""

from __future__ import annotations

import os
from pathlib import Path

from rollout_server import serve
from rollout_server.harbor import HarborBackend

WORKSPACE = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    agent = os.environ.get("HARBOR_AGENT", "oracle")
    backend = HarborBackend(
        WORKSPACE / "tasks" / "hello",
        mode="template",
        environment_type="podman",
        agent=agent,
        # terminus-2 calls the model as "openai/<name>" on the bridge; the bridge routes it to the
        # config's model_path, so the name here is only a label.
        model_name="openai/rollbridge" if agent.startswith("terminus") else None,
        concurrency=int(os.environ.get("HARBOR_CONCURRENCY", "2")),
        cleanup_successful_trials=True,
    )
    serve(backend)
