"""``logs.txt`` lines (docs/spec/supervisor.md §3.8, §8.3): a secret a line break cut in two
leaves no piece on either line, and a huge line is cut to a readable size after redaction."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from launcher.redact import REDACTED, Redactor
from launcher.rundir.logs import MAX_LINE_BYTES, RunLog

KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
_CUT = re.compile(r" … \[cut ([\d,]+) bytes\] … ")


def _pieces(secret: str) -> set[str]:
    """Every 8-character piece of ``secret``, lower-cased."""
    return {secret[i : i + 8].lower() for i in range(len(secret) - 7)}


def _leaked(secret: str, text: str) -> set[str]:
    return {piece for piece in _pieces(secret) if piece in text.lower()}


def _write(tmp_path: Path, redactor: Redactor, messages: list[str]) -> tuple[str, list[str]]:
    """``messages`` logged as a child's output lines; logs.txt and the ``--verbose`` echo."""
    echoed: list[str] = []
    with RunLog(tmp_path / "logs.txt", redactor, echo=echoed.append) as log:
        for message in messages:
            log.info("rollout-server", message)
    return (tmp_path / "logs.txt").read_text(encoding="utf-8"), echoed


@pytest.mark.parametrize("cut", [8, 20, len(KEY) - 8])
def test_a_key_printed_in_two_pieces_leaves_no_piece(tmp_path: Path, cut: int) -> None:
    # print("key:", key[:cut]); print(key[cut:], "rejected")
    text, echoed = _write(tmp_path, Redactor([KEY]), [f"key: {KEY[:cut]}", f"{KEY[cut:]} rejected"])
    assert not _leaked(KEY, text) and not _leaked(KEY, "\n".join(echoed))
    lines = text.splitlines()
    assert lines[0].endswith(f"[rollout-server] key: {REDACTED}")
    assert lines[1].endswith(f"[rollout-server] {REDACTED} rejected")
    assert echoed == lines


def test_an_upper_cased_key_from_the_environment_split_in_two(tmp_path: Path) -> None:
    redactor = Redactor()
    redactor.add_known_env({"GITHUB_PAT": KEY})  # a name the policy did not know before
    upper = KEY.upper()
    text, _ = _write(tmp_path, redactor, [f"TOKEN {upper[:17]}", upper[17:]])
    assert not _leaked(KEY, text)


def test_a_provider_echo_wrapped_at_a_column(tmp_path: Path) -> None:
    echo = f'{{"error": {{"message": "Incorrect API key provided: {KEY}. See docs."}}}}'
    wrapped = textwrap.wrap(echo, 24)
    assert not any(KEY in line for line in wrapped) and len(wrapped) > 3
    text, _ = _write(tmp_path, Redactor([KEY]), wrapped)
    assert not _leaked(KEY, text)
    assert "Incorrect API key" in text and "See docs." in text


def test_a_multi_line_message_has_each_line_checked(tmp_path: Path) -> None:
    message = f"Traceback (most recent call last):\n  header = 'Bearer {KEY[:30]}\n{KEY[30:]}'"
    text, _ = _write(tmp_path, Redactor([KEY]), [message])
    assert not _leaked(KEY, text)
    assert text.count("\n") == 1  # still one physical line per event


def test_unrelated_lines_are_left_alone(tmp_path: Path) -> None:
    messages = ["INFO: 127.0.0.1:5000 - POST /rollout 200", KEY[5:25] + " is not at an edge"]
    text, _ = _write(tmp_path, Redactor([KEY]), [m + "." for m in messages])
    assert [line.split("] ", 1)[1] for line in text.splitlines()] == [m + "." for m in messages]


def test_a_huge_line_is_cut_with_its_head_and_tail(tmp_path: Path) -> None:
    head, tail = "HEAD-" + "é" * 40_000, "😀" * 20_000 + "-TAIL"
    message = head + "x" * 3_000_000 + tail
    echoed: list[str] = []
    with RunLog(tmp_path / "logs.txt", Redactor(), echo=echoed.append) as log:
        returned = log.info("rollout-server", message)
        log.info("rollout-server", "next line")
    data = (tmp_path / "logs.txt").read_bytes()
    first, second, rest = data.split(b"\n")
    assert rest == b"" and second.endswith(b"] next line")
    assert len(first) <= MAX_LINE_BYTES
    line = first.decode("utf-8")  # strict: the cuts fell between characters
    assert echoed[0] == returned == line
    assert "[rollout-server] HEAD-éé" in line and line.endswith("😀😀-TAIL")
    marker = _CUT.search(line)
    assert marker is not None and len(_CUT.findall(line)) == 1
    # What was kept and what the marker says was cut add up to the whole line.
    whole = len(f"{returned.split(' ', 1)[0]} INFO [rollout-server] {message}".encode())
    kept = len(first) - len(marker.group(0).encode())
    assert kept + int(marker.group(1).replace(",", "")) == whole


def test_a_secret_across_the_cut_is_redacted_first(tmp_path: Path) -> None:
    # The key sits where the head is cut: cutting first would leave its first half in the
    # head (no longer the whole key, so no longer matched) and redacting after cannot help.
    prefix = len("2026-01-01T00:00:00.000000Z INFO [rollout-server] ")
    head = (MAX_LINE_BYTES - 64) // 2  # where the head of a line is cut
    at = head - prefix - len(KEY) // 2
    assert prefix + at < head < prefix + at + len(KEY)
    message = "a" * at + KEY + "b" * 200_000
    text, _ = _write(tmp_path, Redactor([KEY]), [message])
    assert not _leaked(KEY, text)
    assert "a" * 100 + REDACTED + "b" * 8 in text and "[cut " in text


def test_a_line_under_the_cap_is_written_whole(tmp_path: Path) -> None:
    message = "y" * (MAX_LINE_BYTES - 200)
    text, _ = _write(tmp_path, Redactor(), [message])
    assert text.endswith(message + "\n") and "[cut" not in text
