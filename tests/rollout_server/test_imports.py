"""rollout_server stays light: the wire types import alone, and nothing pulls in the CLI stack."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import rollout_server.protocol
light = sorted(m for m in ("hypercorn", "quart", "quart_trio", "trio", "httpx") if m in sys.modules)
import rollout_server, rollout_server.client
for name in rollout_server.__all__:
    getattr(rollout_server, name)
heavy = sorted(m for m in ("litellm", "psutil", "quart", "pydantic") if m in sys.modules)
print(light, heavy)
"""


def test_protocol_imports_alone_and_sdk_has_no_heavy_dependencies() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[] []"


def test_sources_import_only_the_base_dependencies() -> None:
    # (httpx itself imports click and rich when they happen to be installed; we never do.)
    pattern = re.compile(
        r"^\s*(?:from|import)\s+(litellm|click|rich|psutil|quart\w*|pydantic)\b", re.M
    )
    offenders = [
        f"{path.name}: {match.group(1)}"
        for path in (REPO / "rollout_server").rglob("*.py")
        for match in pattern.finditer(path.read_text())
    ]
    assert offenders == []
