"""One ``--json`` envelope across commands: ``eval run`` (and ``eval rubric``) answer under
``result`` as every other command does, with the same keys (docs/eval-run.md, JSON output)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from launcher.ui import UI

REPO = Path(__file__).resolve().parents[2]
KEYS = {"schema_version", "cli_version", "operation", "status", "message", "result"}


def _emitted(call: str) -> dict[str, object]:
    out = io.StringIO()
    ui = UI("json", stdout=out, stderr=io.StringIO(), stdin=io.StringIO())
    if call == "run":
        ui.result(status="success", message="done", next_steps=[], resource={"run_name": "r"})
    else:
        ui.envelope("eval.list", "done", {"runs": []})
    document: dict[str, object] = json.loads(out.getvalue())
    return document


def test_eval_run_and_every_other_command_share_one_envelope() -> None:
    run, listing = _emitted("run"), _emitted("list")
    assert set(run) == set(listing) == KEYS
    assert run["result"] == {"run_name": "r"}
    assert (run["operation"], listing["operation"]) == ("eval.run", "eval.list")


def test_no_command_answers_under_resource() -> None:
    # config_schema.py describes the eval config, whose [ray] section has a `resource` key (the
    # Ray resource that picks the nodes): a field of the config, not an answer's envelope.
    sources = [p for p in (REPO / "launcher").rglob("*.py") if p.name != "config_schema.py"]
    assert [p.name for p in sources if '"resource":' in p.read_text()] == []
