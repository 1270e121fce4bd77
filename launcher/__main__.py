"""``python -m launcher``: the same as the ``rollbridge`` command."""

from launcher.cli import main

main()
