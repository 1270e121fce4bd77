"""``python -m launcher``: the same as the ``rollbridge`` command."""

from launcher.entry import main

main()
