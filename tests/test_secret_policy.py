"""One secret policy: the bridge's scrubber, the launcher's redactor and the Harbor archive's
scrubber all redact the same spellings of a secret (rollout_server.net.secrets)."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, quote_plus

import pytest

from bridge.scrub import ErrorScrubber
from rollout_server.harbor.archive import scrub_bytes, secret_spellings
from rollout_server.net.secrets import REDACTED

SECRET = 'sk-test "quoted" /path\\back\nline é'


def _spellings(secret: str) -> dict[str, str]:
    once = json.dumps(secret)[1:-1]
    return {
        "as is": secret,
        "stripped": f"  {secret}  ".strip(),
        "JSON": once,
        "JSON with escaped slashes": once.replace("/", "\\/"),
        "repr": repr(secret)[1:-1],
        "JSON inside repr": repr(json.dumps({"k": secret}))[1:-1],
        "JSON inside JSON": json.dumps(json.dumps(secret))[1:-1],
        "URL-encoded": quote(secret, safe=""),
        "form-encoded": quote_plus(secret),
        "URL-encoded JSON": quote(once, safe=""),
        "upper-cased": secret.upper(),
        "upper-cased JSON": once.upper(),
        "base64 in a Basic header": base64.b64encode(f"user:{secret}".encode()).decode(),
        "URL-safe base64": base64.urlsafe_b64encode(f"ab{secret}".encode()).decode(),
    }


@pytest.mark.parametrize("kind", sorted(_spellings(SECRET)))
def test_the_archive_and_the_bridge_redact_the_same_spellings(kind: str) -> None:
    spelled = _spellings(SECRET)[kind]
    text = f"error: [{spelled}] end"
    bridge = ErrorScrubber([SECRET]).scrub(text)
    archive = scrub_bytes(text.encode(), secret_spellings([SECRET]))
    assert archive is not None
    assert REDACTED in bridge, kind
    assert archive.decode() == bridge, kind
