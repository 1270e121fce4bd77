"""The control API's OpenAPI description validates (openapi-spec-validator) and its Run state
enum is the daemon's state machine (issue 27 item 16)."""

from __future__ import annotations

import pytest

from launcher.daemon.openapi import openapi_doc

validator = pytest.importorskip(
    "openapi_spec_validator", reason="needs openapi-spec-validator (the dev extra)"
)


def test_the_description_validates() -> None:
    doc = openapi_doc("1.2.3")
    validator.validate(doc)
    assert doc["info"]["version"] == "1.2.3"


def test_every_state_is_described() -> None:
    from launcher.daemon import status

    states = openapi_doc("x")["components"]["schemas"]["Run"]["properties"]["state"]["enum"]
    for state in states:
        assert f"``{state}``" in (status.__doc__ or "")
