"""The bridge's error scrubber and the one secret policy it shares with the launcher."""

from __future__ import annotations

import json

import pytest

from bridge.scrub import ErrorScrubber
from rollout_server.net.secrets import KNOWN_SECRET_ENV_NAMES, secret_env_values


def test_scrubber_known_values_longest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_TOKEN", "abcdefgh")
    monkeypatch.setenv("SOME_TOKEN_LONG", "abcdefgh-ijkl")
    monkeypatch.setenv("short_key", "lowercase-name-not-secret")
    monkeypatch.setenv("TINY_KEY", "1234567")
    scrub = ErrorScrubber(["bridge-token"])
    assert (
        scrub("x abcdefgh-ijkl y abcdefgh z bridge-token")
        == "x [REDACTED] y [REDACTED] z [REDACTED]"
    )
    assert scrub("lowercase-name-not-secret 1234567") == "lowercase-name-not-secret 1234567"


@pytest.mark.parametrize(
    "secret",
    [
        "sk-abcdefghijklmnopqrstuvwxyz012345",
        "Bearer abcdefghijklmnop",
        "https://h.test/v1?key=AIzaSyD-abcdefghijklmnopqrstuvwxyz0",
        "https://h.test/v1?alt=sse&api_key=zzzzzzzzzzzz",
        "https://user:hunter22@h.test/",
        "api_key: 'qwertyuiop123'",
        "AKIAABCDEFGHIJKLMNOP",
    ],
)
def test_scrubber_patterns(secret: str) -> None:
    redacted = ErrorScrubber()(f"error with {secret} inside")
    for fragment in (
        "abcdefghijklmnop",
        "zzzzzzzzzzzz",
        "hunter22",
        "qwertyuiop123",
        "ABCDEFGHIJKLMNOP",
    ):
        assert fragment not in redacted
    assert "REDACTED" in redacted


def test_scrubber_shapes_message() -> None:
    scrub = ErrorScrubber(extra=lambda s: s.upper())
    assert scrub("  a \n\n b\t") == "A B"
    assert len(scrub("y" * 5000)) == 1000
    assert ErrorScrubber().scrub("keep  \n  spacing") == "keep  \n  spacing"


# Provider keys that a credential pattern recognises by their prefix, with characters that
# JSON and Python escape.
_KEY = 'sk-proj-abcdefghijklmnop/qrs"tuv\\wxyz0123456789'
_QUOTED_KEY = "sk-proj-abcdefghijklmnop/qrs'tuvwxyz0123456789"


@pytest.mark.parametrize(
    ("key", "echoed"),
    [
        pytest.param(_KEY, json.dumps({"error": {"message": f"bad key {_KEY}"}}), id="json"),
        pytest.param(
            _KEY,
            json.dumps({"error": {"message": f"bad key {_KEY}"}}).replace("/", "\\/"),
            id="json-solidus",
        ),
        pytest.param(_KEY, repr({"detail": f"bad key {_KEY}"}), id="repr"),
        pytest.param(_KEY, repr(json.dumps({"message": _KEY})), id="json-in-repr"),
        pytest.param(
            _QUOTED_KEY, repr(f'provider said "no" to {_QUOTED_KEY}'), id="in-larger-repr"
        ),
    ],
)
def test_an_echoed_key_is_masked_whole_in_any_spelling(key: str, echoed: str) -> None:
    # The credential pattern alone would mask only "sk-proj-abcdefghijklmnop" and leave the
    # rest: the key's own spellings must be matched first.
    assert "wxyz0123456789" in echoed
    out = ErrorScrubber([key])(echoed)
    assert "wxyz0123456789" not in out and "qrs" not in out
    assert "[REDACTED]" in out


def test_an_env_secret_echoed_json_escaped_is_masked_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACME_API_KEY", "acme/123456/abcdef")
    out = ErrorScrubber()('{"error":"key acme\\/123456\\/abcdef refused"}')
    assert out == '{"error":"key [REDACTED] refused"}'


def test_the_environment_is_read_once_when_the_scrubber_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EARLY_TOKEN", "early-token-value")
    scrub = ErrorScrubber()
    monkeypatch.setenv("LATE_TOKEN", "late-token-value")
    assert scrub("early-token-value late-token-value") == "[REDACTED] late-token-value"


def test_secret_env_values_is_the_one_policy() -> None:
    env = {
        "HF_TOKEN": "hf_abcdefgh",
        "MY_PASSWORD": "pw-12345678",
        "DB_SECRET": "db-secret-value",
        "ACME_KEY": "acme-key-value",
        "short_key": "lowercase-name-is-not-a-secret",
        "TINY_SECRET": "1234567",
        "HOME": "/home/someone/long",
        "GOOGLE_APPLICATION_CREDENTIALS": "/path/to/creds.json",
        # Names of files holding a secret: the path is what a user must see to fix it.
        "RAY_AUTH_TOKEN_PATH": "/home/me/.ray/auth_token",
        "AWS_WEB_IDENTITY_TOKEN_FILE": "./token.jwt",
        # ... unless the value is no path: then it may be the secret itself.
        "SERVICE_TOKEN_FILE": "tok-not-a-path-12345",
        # Where a token is bound to: the platform's address is what a user must read.
        "OSMOSIS_TOKEN_PLATFORM_URL": "https://platform.example.com",
        "MY_TOKEN_URL": "http://127.0.0.1:8080/v1/auth",
        # ... unless it may carry a credential (user information, a query), or is no URL.
        "A_TOKEN_URL": "https://user:pw@host.example",
        "B_TOKEN_URL": "https://host.example/x?token=abcdef",
        "C_TOKEN_URI": "not-a-url-value-1",
    }
    assert secret_env_values(env) == [  # in name order
        "acme-key-value",
        "https://user:pw@host.example",
        "https://host.example/x?token=abcdef",
        "not-a-url-value-1",
        "db-secret-value",
        "hf_abcdefgh",
        "pw-12345678",
        "tok-not-a-path-12345",
    ]
    every_known = {name: f"value-of-{name}" for name in KNOWN_SECRET_ENV_NAMES}
    assert sorted(secret_env_values(every_known)) == sorted(every_known.values())


def test_key_and_bearer_shapes_are_found_in_any_case() -> None:
    # Output that was upper-cased: the shape of an unknown provider key or rollout bearer.
    bearer = "rbk-" + "aB3_" * 10 + "xY9"
    for shape in ("sk-abcdefghijklmnopqrstu", bearer):
        for spelled in (shape, shape.upper()):
            assert ErrorScrubber().scrub(f"got {spelled} here") == "got REDACTED here"
    # "Basic" in another case is an ordinary word, not an authorization header.
    assert ErrorScrubber().scrub("using basic settings") == "using basic settings"
