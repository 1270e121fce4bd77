"""Tests of ``rollbridge eval rubric``."""
