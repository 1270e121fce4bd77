"""``python -m bridge serve …``: the bridge CLI without the rollbridge root command."""

from bridge.cli import bridge

bridge(prog_name="python -m bridge")
