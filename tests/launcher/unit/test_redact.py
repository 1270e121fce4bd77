"""Redaction of secret values and their spellings (docs/spec/supervisor.md §8.3)."""

from __future__ import annotations

import base64
import json
import traceback

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.bearers import rollout_bearer
from launcher.redact import KNOWN_SECRET_ENV_NAMES, REDACTED, Redactor


def test_plain_value_any_length_for_configured_secrets() -> None:
    r = Redactor()
    r.add("k9")
    assert r("token=k9; again k9") == f"token={REDACTED}; again {REDACTED}"
    assert r("nothing here") == "nothing here"


def test_empty_values_are_ignored() -> None:
    r = Redactor(["", None])  # type: ignore[list-item]
    assert r("abc") == "abc"
    assert r.patterns == frozenset()


def test_longest_value_wins() -> None:
    r = Redactor(["abc", "abcdef-long-secret"])
    assert r("x abcdef-long-secret y abc") == f"x {REDACTED} y {REDACTED}"
    assert "-long-secret" not in r("abcdef-long-secret")


def test_whitespace_stripped_form() -> None:
    r = Redactor(["  padded-secret-value\n"])
    assert r("got padded-secret-value!") == f"got {REDACTED}!"


def test_each_line_of_a_secret_of_several_lines() -> None:
    """A log is written a line at a time: a key broken in two, or a PEM key, leaves no line."""
    r = Redactor(["sk-test-\nSECRETVALUE123"])
    assert r("KEY= sk-test-") == f"KEY= {REDACTED}"
    assert r("SECRETVALUE123") == REDACTED
    pem = "-----BEGIN KEY-----\r\nMIIEvQIBADANBgkq\r\nab\r\n-----END KEY-----"
    r = Redactor([pem])
    assert r("line MIIEvQIBADANBgkq") == f"line {REDACTED}"
    assert r("ab cd") == "ab cd"  # a line too short to be a secret on its own stays


def test_json_escaped_form() -> None:
    secret = 'sk"quote\\back\nline\u00e9'
    r = Redactor([secret])
    ascii_json = json.dumps({"key": secret})
    utf8_json = json.dumps({"key": secret}, ensure_ascii=False)
    assert secret not in r(ascii_json) and REDACTED in r(ascii_json)
    assert r(ascii_json) == json.dumps({"key": "X"}).replace("X", REDACTED)
    assert r(utf8_json) == json.dumps({"key": "X"}).replace("X", REDACTED)


def test_python_repr_form_in_tracebacks() -> None:
    secret = "it's\tsecret"
    r = Redactor([secret])
    try:
        raise ValueError({"password": secret})
    except ValueError:
        text = traceback.format_exc()
    assert repr(secret)[1:-1] in text
    out = r(text)
    assert repr(secret)[1:-1] not in out and "secret" not in out.split("ValueError")[-1]
    assert REDACTED in out


def test_known_env_values_need_eight_characters() -> None:
    env = {
        "OPENAI_API_KEY": "sk-12345678",
        "HF_TOKEN": "short",
        "UNRELATED_SETTING": "unrelated-long-value",
        "OSMOSIS_TOKEN": "  osm-long-token  ",
    }
    r = Redactor()
    r.add_known_env(env)
    text = "sk-12345678 short unrelated-long-value osm-long-token"
    assert r(text) == f"{REDACTED} short unrelated-long-value {REDACTED}"
    # A short known value is still redacted when it is also a configured secret.
    r.add("short")
    assert r("short") == REDACTED


def test_env_secrets_follow_the_bridge_policy() -> None:
    # One answer to "which variables are secrets" for the launcher and the bridge: the known
    # names, and any name containing KEY, TOKEN, SECRET or PASSWORD (case-sensitive).
    env = {
        "ACME_KEY": "acme-key-value",
        "DB_PASSWORD": "db-password-value",
        "lower_key": "lower-case-name-value",
        "HOME": "/home/someone/long",
    }
    r = Redactor()
    r.add_known_env(env)
    text = "acme-key-value db-password-value lower-case-name-value /home/someone/long"
    assert r(text) == f"{REDACTED} {REDACTED} lower-case-name-value /home/someone/long"


def test_known_env_name_list_is_the_spec_list() -> None:
    assert len(KNOWN_SECRET_ENV_NAMES) == 25
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in KNOWN_SECRET_ENV_NAMES
    assert {"OPENAI_API_KEY", "OSMOSIS_TOKEN", "AWS_SECRET_ACCESS_KEY", "MSWEA_API_KEY"} <= set(
        KNOWN_SECRET_ENV_NAMES
    )


def test_repr_form_inside_a_larger_repr() -> None:
    # Alone, "it's-a-secret" is shown in double quotes; inside a string that also holds a ",
    # Python quotes with ' and writes \'.
    secret = "it's-a-secret"
    text = repr(f'provider said "no" to {secret}')
    assert "it\\'s-a-secret" in text
    assert Redactor([secret])(text) == repr('provider said "no" to X').replace("X", REDACTED)


def test_json_inside_a_repr_and_escaped_solidus() -> None:
    secret = "back\\slash/and/more"
    r = Redactor([secret])
    nested = repr(json.dumps({"key": secret}))
    assert "back\\\\\\\\slash" in nested  # the one backslash, JSON-escaped then repr-doubled
    assert "slash" not in r(nested)
    solidus = json.dumps({"key": secret}).replace("/", "\\/")
    assert r(solidus) == json.dumps({"key": "X"}).replace("X", REDACTED)


def test_regex_metacharacters_are_literal() -> None:
    r = Redactor(["a.b*c"])
    assert r("aXbbbc a.b*c") == f"aXbbbc {REDACTED}"


def test_values_added_later_take_effect() -> None:
    r = Redactor(["first-secret"])
    assert r("second-secret") == "second-secret"
    r.add("second-secret")
    assert r("first-secret second-secret") == f"{REDACTED} {REDACTED}"


def test_redact_obj() -> None:
    r = Redactor(["hunter22"])
    obj = {"msg": "pw hunter22", "hunter22": [1, "x hunter22", {"n": None}], "t": ("hunter22",)}
    assert r.redact_obj(obj) == {
        "msg": f"pw {REDACTED}",
        REDACTED: [1, f"x {REDACTED}", {"n": None}],
        "t": [REDACTED],
    }


def test_whitespace_only_values_are_ignored() -> None:
    r = Redactor(["   ", "\n"])
    assert r("a b\nc") == "a b\nc"


_SECRET_TEXT = st.text(
    alphabet=st.sampled_from(
        [*list("abcxyz0129-_./+="), '"', "\\", "'", "\n", "\t", "é", "€", " ", "\x01"]
    ),
    min_size=1,
    max_size=24,
).filter(lambda s: s.strip() != "")


@settings(max_examples=200, deadline=None)
@given(secret=_SECRET_TEXT, before=st.text(max_size=10), after=st.text(max_size=10))
def test_every_spelling_of_a_secret_is_redacted(secret: str, before: str, after: str) -> None:
    r = Redactor([secret])
    spellings = {
        secret,
        secret.strip(),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        json.dumps(secret)[1:-1].replace("/", "\\/"),
        repr(secret)[1:-1],
        repr(secret + '"')[1:-2],
        repr(json.dumps(secret)[1:-1])[1:-1],
    }
    for spelling in spellings:
        out = r(before + spelling + after)
        assert spelling not in out.replace(REDACTED, "\x00"), (spelling, out)
        assert REDACTED in out


def test_a_rollout_bearer_is_redacted_in_any_case() -> None:
    # Derived per rollout, so on no list of values: found by its shape, in any case, as the
    # known values are (a program that upper-cases its output upper-cases the bearer too).
    bearer = rollout_bearer("run-token", "r1")
    r = Redactor()
    for spelled in (bearer, bearer.upper(), bearer.lower()):
        assert r(f"auth {spelled} end") == f"auth {REDACTED} end"


def test_a_basic_auth_header_of_a_known_key_is_redacted() -> None:
    key = "sk-ant-api03-Zq8Wn3pL0xV7rT2yU9"
    header = "Authorization: Basic " + base64.b64encode(f"user:{key}".encode()).decode()
    assert Redactor([key])(header) == f"Authorization: Basic {REDACTED}"
