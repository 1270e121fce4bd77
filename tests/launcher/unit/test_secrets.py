"""[secrets] resolution, the dotenv file, and environment scoping (docs/spec/supervisor.md §8.1-8.2)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from launcher.errors import CLIError
from launcher.secrets import (
    parse_secrets_text,
    provider_values,
    read_secrets_file,
    resolve_secrets,
    scoped_environ,
)


def test_parse_dotenv_rules() -> None:
    text = (
        "# comment\n\n  A = plain value  \nexport B='single # kept'\nC=\"double\" # note\n"
        'E=x=y # staging\nA=override\nF=\nG="two\nlines"\n'
    )
    assert parse_secrets_text(text, "f") == {
        "A": "override",
        "B": "single # kept",
        "C": "double",
        "E": "x=y",
        "F": "",
        "G": "two\nlines",
    }


def test_an_inline_comment_is_not_part_of_the_value() -> None:
    assert parse_secrets_text("KEY=abc # staging\n", "f") == {"KEY": "abc"}


@pytest.mark.parametrize("line", ["no-equals-here", "1BAD=x", "=s3cr3t", "BAD NAME=x"])
def test_invalid_lines_never_echo_content(line: str) -> None:
    with pytest.raises(CLIError) as info:
        parse_secrets_text(f"OK=1\n{line}\n", "stdin")
    assert info.value.message == "Invalid line 2 in stdin: expected NAME=value."
    assert line not in info.value.message


def test_provider_values_are_the_names_the_rollout_never_inherits() -> None:
    from launcher.rollout_child import is_provider_env_name

    file_values = {"OPENAI_API_KEY": "sk-1", "OPENAI_BASE_URL": "http://x", "MY_FLAG": "1"}
    assert provider_values(file_values, is_provider_env_name) == {
        "OPENAI_API_KEY": "sk-1",
        "OPENAI_BASE_URL": "http://x",
    }
    assert provider_values({"ANTHROPIC_API_KEY": ""}, is_provider_env_name) == {}


def test_read_secrets_file_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "s.env").write_text("TOKEN=abc\n")
    assert read_secrets_file("s.env", cwd=tmp_path) == {"TOKEN": "abc"}
    assert read_secrets_file("-", cwd=tmp_path, stdin=io.StringIO("X=1\n")) == {"X": "1"}
    with pytest.raises(CLIError, match="does not exist"):
        read_secrets_file("missing.env", cwd=tmp_path)
    (tmp_path / "adir").mkdir()
    with pytest.raises(CLIError, match=r"^--secrets-file adir is a directory; give a dotenv file$"):
        read_secrets_file("adir", cwd=tmp_path)


def test_precedence_file_then_env_then_prompt() -> None:
    asked: list[str] = []

    def prompt(text: str) -> str:
        asked.append(text)
        return "typed"

    out = resolve_secrets(
        ["A", "B", "C", "D"],
        file_values={"A": "from-file", "UNLISTED": "x"},
        environ={"A": "env-a", "B": "env-b", "C": ""},
        interactive=True,
        prompt=prompt,
    )
    assert out == {"A": "from-file", "B": "env-b", "C": "typed", "D": "typed"}
    assert asked == ["Value for C: ", "Value for D: "]


def test_missing_secrets_non_interactive() -> None:
    with pytest.raises(CLIError) as info:
        resolve_secrets(["A", "B", "C"], environ={"B": "set"}, interactive=False)
    assert info.value.code == "INTERACTIVE_REQUIRED"
    assert info.value.message == "No value found for: A, C. Export them or pass --secrets-file."
    assert info.value.details == {"missing": ["A", "C"], "flags": ["--secrets-file"]}


def test_empty_prompt_answer_is_refused() -> None:
    with pytest.raises(CLIError) as info:
        resolve_secrets(["A"], environ={}, interactive=True, prompt=lambda _: "")
    assert info.value.message == "Secret value for A must not be empty."


def test_no_names_means_nothing_resolved() -> None:
    assert resolve_secrets([], environ={}, interactive=False) == {}


def test_scoped_environ_restores_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RB_TEST_EXISTING", "old")
    monkeypatch.delenv("RB_TEST_NEW", raising=False)
    with scoped_environ({"RB_TEST_EXISTING": "new", "RB_TEST_NEW": "v"}):
        assert os.environ["RB_TEST_EXISTING"] == "new" and os.environ["RB_TEST_NEW"] == "v"
    assert os.environ["RB_TEST_EXISTING"] == "old"
    assert "RB_TEST_NEW" not in os.environ
    with pytest.raises(RuntimeError), scoped_environ({"RB_TEST_NEW": "v"}):
        raise RuntimeError("boom")
    assert "RB_TEST_NEW" not in os.environ


def test_scoped_environ_on_a_plain_mapping() -> None:
    env = {"A": "1"}
    with scoped_environ({"A": "2", "B": "3"}, env):
        assert env == {"A": "2", "B": "3"}
    assert env == {"A": "1"}
