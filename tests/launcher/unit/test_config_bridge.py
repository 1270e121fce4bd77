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


@pytest.mark.parametrize("mode", ["off", "on", "auto"])
def test_upstream_http2_is_read(tmp_path: Path, mode: str) -> None:
    text = BASE + SECRETS + f'[bridge]\nupstream_http2 = "{mode}"\n'
    config = load_eval_config(write(tmp_path, text))
    assert config.upstream_http2 == mode
    assert config.bridge == ApiOptions()


def test_upstream_http2_is_auto_when_absent(tmp_path: Path) -> None:
    assert load_eval_config(write(tmp_path, BASE + SECRETS)).upstream_http2 == "auto"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('upstream_http2 = "yes"', "bridge.upstream_http2 must be one of off, on, auto"),
        ("upstream_http2 = true", "bridge.upstream_http2"),
        ('hosted_tools = "web_search"', "bridge.hosted_tools"),
        ('messages = "sometimes"', "bridge.messages"),
        ("store = true", "store"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, body: str, named: str) -> None:
    error = error_of(write(tmp_path, BASE + SECRETS + "[bridge]\n" + body + "\n"))
    assert named in str(error)
