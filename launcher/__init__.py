"""The rollbridge supervisor: ``rollbridge eval run`` and its pieces."""
