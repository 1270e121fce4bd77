"""Generated run names and --name validation (docs/spec/supervisor.md §4.1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import launcher.rundir.names as names
from launcher.errors import CLIError


def test_word_lists() -> None:
    assert len(names.ADJECTIVES) == 40 and len(set(names.ADJECTIVES)) == 40
    assert len(names.ANIMALS) == 40 and len(set(names.ANIMALS)) == 40


def test_generated_name_shape(tmp_path: Path) -> None:
    for _ in range(50):
        name = names.generate_run_name(tmp_path)
        adjective, animal, number = name.split("-")
        assert adjective in names.ADJECTIVES and animal in names.ANIMALS
        assert re.fullmatch(r"0|[1-9]\d?", number)


def test_generated_name_avoids_existing_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks = iter(["brave-fox-1", "brave-fox-1", "calm-owl-2"])
    monkeypatch.setattr(names, "random_run_name", lambda: next(picks))
    (tmp_path / "brave-fox-1").mkdir()
    assert names.generate_run_name(tmp_path) == "calm-owl-2"


def test_generated_name_gives_up_after_100_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(names, "random_run_name", lambda: "brave-fox-1")
    (tmp_path / "brave-fox-1").mkdir()
    with pytest.raises(CLIError, match="could not generate an unused local evaluation run name"):
        names.generate_run_name(tmp_path)


@pytest.mark.parametrize("name", ["run1", "a.b_c-d", "ünïcode", "9lives", "x" * 96])
def test_valid_names(name: str) -> None:
    assert names.validate_run_name(name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "run name must not be empty"),
        ("x" * 97, "run name must be at most 96 characters"),
        ("a/b", "run name must be a single path segment"),
        ("a\\b", "run name must be a single path segment"),
        ("a\x00b", "run name must be a single path segment"),
        ("..", "run name must be a single path segment"),
        (".locks", "run name '.locks' is reserved"),
        ("-x", "run name must start with a letter or digit"),
        (".hidden", "run name must start with a letter or digit"),
        (
            "a b",
            "run name must start with a letter or digit and use only letters, digits, '.', '_', or '-': 'a b'",
        ),
    ],
)
def test_invalid_names(name: str, message: str) -> None:
    with pytest.raises(CLIError) as info:
        names.validate_run_name(name)
    assert info.value.message.startswith(message)
