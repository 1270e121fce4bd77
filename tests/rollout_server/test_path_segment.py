"""``is_single_path_segment``: the one rollout-id check, against its definition."""

from __future__ import annotations

import ntpath
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_server.protocol import is_single_path_segment


def _by_definition(value: str) -> bool:
    """A non-empty name other than ``.``/``..``, without NUL, that is its own basename on posix
    and on Windows (this is the documented rule, spelled with the standard library)."""
    if not value or value in {".", ".."} or "\x00" in value:
        return False
    return posixpath.basename(value) == value and ntpath.basename(value) == value


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("run-r0-s0", True),
        ("a.b", True),
        ("...", True),
        ("ab:c", True),
        ("x:y", False),
        ("", False),
        (".", False),
        ("..", False),
        ("a/b", False),
        ("a\\b", False),
        ("a\x00b", False),
        ("C:x", False),
        ("C:", False),
    ],
)
def test_examples(value: str, ok: bool) -> None:
    assert is_single_path_segment(value) is ok


@given(st.text(alphabet=st.sampled_from("ab.:/\\\x00C "), max_size=6) | st.text(max_size=8))
def test_matches_the_definition(value: str) -> None:
    assert is_single_path_segment(value) == _by_definition(value)
