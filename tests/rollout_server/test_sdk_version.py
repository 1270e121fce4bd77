"""sdk_version(): the installed distribution's version, read as importlib.metadata reads it."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from rollout_server.protocol import sdk_version


def _dist(root: Path, name: str, metadata_text: str, file: str = "METADATA") -> Path:
    info = root / name
    info.mkdir(parents=True)
    (info / file).write_text(metadata_text, encoding="utf-8")
    return root


def test_the_installed_version_is_importlib_metadatas() -> None:
    assert sdk_version() == metadata.version("rollbridge")


@pytest.mark.parametrize(
    ("name", "file", "text"),
    [
        ("rollbridge-9.8.7.dist-info", "METADATA", "Metadata-Version: 2.1\nVersion: 9.8.7\n"),
        ("Rollbridge-9.8.7.dist-info", "METADATA", "name: Rollbridge\nversion: \t9.8.7\r\n"),
        ("rollbridge.egg-info", "PKG-INFO", "Name: rollbridge\nVersion: 9.8.7\n"),
    ],
)
def test_the_first_distribution_on_the_path_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, file: str, text: str
) -> None:
    text += "\nVersion: 0.0.0-in-the-body\n"  # after the blank line: the body, not a field
    _dist(tmp_path / "first", name, text, file)
    _dist(tmp_path / "second", "rollbridge-1.0.0.dist-info", "Version: 1.0.0\n")
    path = [str(tmp_path / name) for name in ("missing", "first", "second")]
    monkeypatch.setattr(sys, "path", [*path, *sys.path])
    assert sdk_version() == metadata.version("rollbridge") == "9.8.7"


def test_metadata_without_a_version_is_left_to_importlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dist(tmp_path / "first", "rollbridge-2.0.dist-info", "Name: rollbridge\n")
    _dist(tmp_path / "second", "rollbridge-1.0.0.dist-info", "Version: 1.0.0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "first"), str(tmp_path / "second")])
    # importlib.metadata finds the first one too and reads no version there (None from the
    # stdlib; a KeyError once the importlib_metadata backport's finder is installed, as
    # litellm's import does): either way the answer is "unknown".
    assert sdk_version() == "unknown"


def test_no_distribution_reads_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert sdk_version() == "unknown"
