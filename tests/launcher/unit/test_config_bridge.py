"""The eval config's [bridge] section (launcher/config_bridge.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.apis import ApiOptions
from launcher.config import load_eval_config
from tests.launcher.unit.test_config import BASE, SECRETS, error_of, write


def test_absent_means_defaults(tmp_path: Path) -> None:
    assert load_eval_config(write(tmp_path, BASE + SECRETS)).bridge is None


def test_section_is_read(tmp_path: Path) -> None:
    text = BASE + SECRETS + '[bridge]\nhosted_tools = ["web_search"]\nresponses = "native"\n'
    config = load_eval_config(write(tmp_path, text))
    assert config.bridge == ApiOptions(("web_search",), "native", "auto")


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('hosted_tools = "web_search"', "bridge.hosted_tools"),
        ('messages = "sometimes"', "bridge.messages"),
        ("store = true", "store"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, body: str, named: str) -> None:
    error = error_of(write(tmp_path, BASE + SECRETS + "[bridge]\n" + body + "\n"))
    assert named in str(error)
