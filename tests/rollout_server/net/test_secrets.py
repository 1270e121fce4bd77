"""The one secret policy (rollout_server.net.secrets, docs/spec/supervisor.md §8.3): which
variables hold secrets, and the spellings beyond escaping that a secret is found in: any
letter case, base64 inside a larger base64 text, and pieces cut off by a line break."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pytest

from rollout_server.net.secrets import (
    REDACTED,
    SecretMatcher,
    is_secret_env_name,
    secret_env_values,
)

# Its base64 differs between the two alphabets ("~~>>??" encode to + and /).
KEY = "sk-live~~>>??Zq8-Wn3pL0xV7rT2"


def _matcher(*values: str) -> SecretMatcher:
    matcher = SecretMatcher()
    for value in values:
        matcher.add(value)
    return matcher


# -- base64 --------------------------------------------------------------------------------


@pytest.mark.parametrize("user", ["", "u:", "ab:", "user:", "admin:", "x"])
@pytest.mark.parametrize("alphabet", ["standard", "urlsafe"])
@pytest.mark.parametrize("padded", [True, False])
def test_a_secret_inside_base64_is_redacted_at_every_alignment(
    user: str, alphabet: str, padded: bool
) -> None:
    encode = base64.b64encode if alphabet == "standard" else base64.urlsafe_b64encode
    blob = encode((user + KEY).encode()).decode()
    if not padded:
        blob = blob.rstrip("=")
    text = f"Authorization: Basic {blob}\r\nHost: api.example"
    out = _matcher(KEY).sub(REDACTED, text)
    # The whole run goes, padding included: not a character of the encoding is left.
    assert out == f"Authorization: Basic {REDACTED}\r\nHost: api.example"


def test_the_two_alphabets_really_differ_for_the_test_key() -> None:
    # Otherwise the parametrization above would test one alphabet twice.
    assert base64.b64encode(KEY.encode()) != base64.urlsafe_b64encode(KEY.encode())


def test_base64_of_a_secret_in_json_and_in_the_archive_check() -> None:
    blob = base64.b64encode(f"{{'key': '{KEY}'}}".encode()).decode()
    matcher = _matcher(KEY)
    text = json.dumps({"auth": blob, "other": "kept"})
    assert matcher.found(text)
    clean = matcher.sub(REDACTED, text)
    assert clean == json.dumps({"auth": REDACTED, "other": "kept"})
    assert not matcher.found(clean)
    assert matcher.sub_bytes(REDACTED.encode(), text.encode()) == clean.encode()


def test_base64_without_a_secret_is_left_alone() -> None:
    matcher = _matcher(KEY, "another-secret-value-1234")
    text = "data " + base64.b64encode(bytes(range(256)) * 4).decode() + " end"
    assert matcher.sub(REDACTED, text) is text


def test_a_core_shorter_than_16_characters_is_not_looked_for() -> None:
    # 13 bytes starting one byte into a 3-byte group leave 9 whole bytes (12 characters): so
    # short a core could match unrelated base64 by chance. At the other alignments 12 whole
    # bytes are left (16 characters), enough.
    short = "abcdefghijklm"
    matcher = _matcher(short)
    too_short = base64.b64encode(("a" + short).encode()).decode()
    assert matcher.sub(REDACTED, too_short) == too_short
    for user in ("", "ab"):
        blob = base64.b64encode((user + short).encode()).decode()
        assert matcher.sub(REDACTED, blob) == REDACTED


# -- letter case ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spell", "quote"),
    [
        (str.upper, ""),
        (str.lower, ""),
        (str.swapcase, ""),
        (lambda s: json.dumps(s).upper(), '"'),  # the escapes upper-cased too: \\N, \\U00E9
        (lambda s: json.dumps(s.upper()), '"'),  # the upper-cased letter escaped: \\u00c9
        (lambda s: repr(s.upper()), "'"),
        (lambda s: repr(json.dumps(s)).upper(), "'\""),
    ],
)
def test_a_secret_in_another_letter_case_is_redacted(
    spell: Callable[[str], str], quote: str
) -> None:
    secret = "Sk-Proj-aBcDeF\nghé/😀"
    text = "said: " + spell(secret) + " end"
    assert secret not in text
    out = _matcher(secret).sub(REDACTED, text)
    assert out == f"said: {quote}{REDACTED}{quote[::-1]} end"


def test_case_does_not_make_other_text_a_secret() -> None:
    matcher = _matcher("Token-Value-12345")
    assert (
        matcher.sub(REDACTED, "token-value-1234 TOKEN-VALUE-12345")
        == f"token-value-1234 {REDACTED}"
    )


def test_a_letter_whose_lower_case_is_longer_keeps_positions() -> None:
    # "İ".lower() is two characters: the matcher must not cut the text at shifted places.
    matcher = _matcher("secret-value-42")
    text = "İİ SECRET-VALUE-42 tail İ"
    assert matcher.sub(REDACTED, text) == f"İİ {REDACTED} tail İ"
    assert matcher.found(text)


# -- pieces at a line's edge ---------------------------------------------------------------

SPLIT = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


@pytest.mark.parametrize("cut", [8, 12, 20, len(SPLIT) - 8])
def test_a_secret_cut_by_a_line_break_leaves_no_piece(cut: int) -> None:
    matcher = _matcher(SPLIT)
    first = matcher.sub_fragments(REDACTED, "provider said: key " + SPLIT[:cut])
    second = matcher.sub_fragments(REDACTED, "   " + SPLIT[cut:] + " is not valid")
    assert first == f"provider said: key {REDACTED}"
    assert second == f"   {REDACTED} is not valid"


def test_the_middle_of_a_secret_wrapped_over_three_lines_is_redacted() -> None:
    matcher = _matcher(SPLIT)
    lines = [SPLIT[i : i + 16] for i in range(0, len(SPLIT), 16)]
    assert len(lines) == 3
    assert [matcher.sub_fragments(REDACTED, line) for line in lines] == [REDACTED] * 3
    wrapped = "key:\n" + "\n".join(lines) + "\nend"
    assert matcher.sub_fragments(REDACTED, wrapped) == "\n".join(
        ["key:", REDACTED, REDACTED, REDACTED, "end"]
    )


def test_pieces_are_found_in_any_case_and_each_line_of_a_text() -> None:
    matcher = _matcher(SPLIT)
    text = "Traceback:\r\n  KEY=" + SPLIT[:15].upper() + "\n" + SPLIT[15:].lower() + "!"
    out = matcher.sub_fragments(REDACTED, text)
    assert out == f"Traceback:\r\n  KEY={REDACTED}\n{REDACTED}!"


def test_short_pieces_and_pieces_not_at_an_edge_are_kept() -> None:
    matcher = _matcher(SPLIT)
    for line in (
        "ends with a short piece sk-proj",  # 7 characters: below the minimum
        SPLIT[-7:] + " starts with a short one",
        SPLIT[10:30] + " more",  # the middle of the secret, then other text: no cut here
        "unrelated text of some length",
    ):
        assert matcher.sub_fragments(REDACTED, line) is line


def test_a_value_spanning_lines_is_redacted_whole_before_the_edges() -> None:
    # Cutting the first line's edge first would break the whole value's match.
    value = "00000000\rtail-of-it"
    matcher = _matcher(value)
    assert matcher.sub_fragments(REDACTED, value) == REDACTED


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_PAT",
        "GH_PAT",
        "AZURE_DEVOPS_EXT_PAT",
        "MYSQL_PWD",
        "DB_PASSWD",
        "GPG_PASSPHRASE",
        "NPM_CONFIG__AUTH",
        "REGISTRY_AUTH",
        "HTTP_COOKIE",
        "SESSION_COOKIE",
        "GOOGLE_CREDENTIALS",
        "SSH_PRIVATE_KEY",
    ],
)
def test_more_names_hold_secrets(name: str) -> None:
    assert is_secret_env_name(name)
    assert secret_env_values({name: "v4lue-of-the-secret"}) == ["v4lue-of-the-secret"]


@pytest.mark.parametrize(
    "name",
    [
        "PWD",  # the shell's working directory
        "OLDPWD",
        "PATH",
        "MANPATH",
        "GIT_AUTHOR_NAME",
        "AUTHOR",
        "SSH_AUTH_SOCK",
        "COOKIE_DOMAIN",
        "PATTERN",
        "OAUTH_SCOPE",
        "CREDENTIALS_HELP",
    ],
)
def test_names_that_look_alike_hold_no_secret(name: str) -> None:
    assert not is_secret_env_name(name)


def test_a_path_in_a_credentials_or_pwd_variable_stays_readable() -> None:
    environ = {
        "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/keys/service-account.json",
        "BUILD_PWD": "/home/me/project",
        # The credentials themselves, and a password, are secrets.
        "GOOGLE_CREDENTIALS": '{"type": "service_account", "private_key": "x"}',
        "MYSQL_PWD": "hunter2-but-longer",
    }
    assert secret_env_values(environ) == [
        '{"type": "service_account", "private_key": "x"}',
        "hunter2-but-longer",
    ]
