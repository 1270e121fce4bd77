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


def test_the_http_listeners_door_is_described() -> None:
    """A client generated from the description sends the token and knows the door's answers
    (what tests/daemon/test_daemon_basics.py checks the daemon gives)."""
    doc = openapi_doc("x")
    assert {"bearer": []} in doc["security"] and {} in doc["security"]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            answers = op["responses"]
            assert {"401", "421"} <= set(answers), (method, path)
            if method != "get":
                assert "403" in answers, (method, path)
            if "requestBody" in op:
                assert "413" in answers, (method, path)
    assert "409" in doc["paths"]["/v1/diff"]["get"]["responses"]
