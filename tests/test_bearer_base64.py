"""A rollout's own bridge bearer (``rbk-`` and 43 characters, found by its shape) is redacted
inside base64 too (an HTTP Basic header of ``user:<bearer>``), and when a line break cuts it in
two (a workflow printing it in two pieces), in ``logs.txt`` and on the ``--verbose`` terminal."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from bridge.bearers import rollout_bearer
from bridge.scrub import ErrorScrubber
from launcher.redact import REDACTED, Redactor
from launcher.rundir.logs import RunLog

BEARER = rollout_bearer("run-token", "rollout-7")
# The brief's example: base64("user:" + a bearer).
EXAMPLE = "dXNlcjpyYmstcXV4UG1Mcl9JMFFyQWh0N2x3ZnhfOTk4R1NvSGY1aUVuSWExdnJwS1l0aw=="
EXAMPLE_BEARER = "rbk-quxPmLr_I0QrAht7lwfx_998GSoHf5iEnIa1vrpKYtk"


def _spellings(bearer: str) -> list[str]:
    """Base64 of text holding ``bearer`` as a program would print it: each of the three byte
    alignments, both alphabets, padded or not, and in a URL's query (``%2B``, ``%2F``, ``%3D``)."""
    found = []
    for value in (bearer, bearer.upper(), bearer.lower()):
        for before in ("", "u:", "user:", "x"):
            for after in ("", "!", "@host"):
                raw = (before + value + after).encode()
                for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
                    text = encoded.decode()
                    found += [text, text.rstrip("=")]
                    percent = text.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
                    found.append(percent)
    return list(dict.fromkeys(found))


def test_the_example_decodes_to_a_bearer() -> None:
    assert base64.b64decode(EXAMPLE) == b"user:" + EXAMPLE_BEARER.encode()
    line = f"GET / Authorization: Basic {EXAMPLE} 200"
    assert Redactor()(line) == f"GET / Authorization: Basic {REDACTED} 200"


@pytest.mark.parametrize("spelled", _spellings(BEARER))
def test_every_base64_spelling_is_redacted_whole(spelled: str) -> None:
    redactor = Redactor()
    text = f"header={spelled}; next"
    assert redactor(text) == f"header={REDACTED}; next"
    assert redactor.found(text)
    assert redactor.redact_bytes(text.encode()) == f"header={REDACTED}; next".encode()


def test_files_and_json_documents() -> None:
    redactor = Redactor()
    header = "Basic " + base64.b64encode(f"me:{BEARER}".encode()).decode()
    document = json.dumps({"messages": [{"headers": {"Authorization": header}}]}).encode()
    clean = redactor.redact_json_bytes(document)
    assert json.loads(clean) == {"messages": [{"headers": {"Authorization": f"Basic {REDACTED}"}}]}


def test_base64_without_a_bearer_is_left_alone() -> None:
    redactor = Redactor()
    # "rbk-" encoded (its anchors are there), but not a bearer's 43 characters after it.
    for text in ("the prefix rbk- alone", "user:rbk-short", "rbk-" + "!" * 43):
        encoded = base64.b64encode(text.encode()).decode()
        line = f"data {encoded} end"
        assert redactor(line) == line
        assert not redactor.found(line)
        data = line.encode()
        assert redactor.redact_bytes(data) is data
    plain = "a 200-character line " * 10
    assert redactor(plain) == plain


def test_the_bridge_scrubber_masks_it_too() -> None:
    scrub = ErrorScrubber()
    for spelled in _spellings(BEARER)[:12]:
        assert scrub.scrub(f"upstream said {spelled} ok") == "upstream said REDACTED ok"


def test_a_bearer_printed_in_two_pieces_in_logs_and_the_terminal(tmp_path: Path) -> None:
    echoed: list[str] = []
    with RunLog(tmp_path / "logs.txt", Redactor(), echo=echoed.append) as log:
        log.info("rollout", "my bearer: " + BEARER[:20])
        log.info("rollout", BEARER[20:])
    written = (tmp_path / "logs.txt").read_text()
    assert BEARER[4:20] not in written
    assert f"my bearer: {REDACTED}" in written
    assert "my bearer: " + REDACTED in echoed[0]


@pytest.mark.parametrize("cut", [4, 5, 8, 20, 30, 46])
def test_a_bearer_cut_by_a_line_break_in_one_text(cut: int) -> None:
    redactor = Redactor()
    text = f"bearer {BEARER[:cut]}\n  {BEARER[cut:]} done\nnext"
    assert redactor.redact_fragments(text) == f"bearer {REDACTED}\n  {REDACTED} done\nnext"


def test_a_line_ending_in_a_bearers_beginning_any_case() -> None:
    redactor = Redactor()
    assert redactor.redact_fragments("key " + BEARER[:12].upper() + "  ") == f"key {REDACTED}  "
    assert redactor.redact_fragments("key " + BEARER[:30]) == f"key {REDACTED}"


def test_text_about_the_prefix_is_left_alone() -> None:
    redactor = Redactor()
    for line in ("bearers start with rbk-", "e.g. rbk-id", "rbk-abc\nHello world", "rbk-"):
        assert redactor.redact_fragments(line) == line
