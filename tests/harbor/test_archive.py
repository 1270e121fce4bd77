"""The trial archive's scrubbing, without podman: secrets never reach a retained file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from rollout_server.harbor.archive import archive_trial, scrub_bytes, secret_spellings

BEARER = "rb-bearer-0123456789abcdef"


def _trial(root: Path) -> Path:
    trial = root / "trial-x"
    (trial / "agent").mkdir(parents=True)
    (trial / "verifier").mkdir()
    (trial / "artifacts").mkdir()
    (trial / "result.json").write_text(json.dumps({"key": BEARER, "reward": 1}))
    (trial / "agent" / "log.txt").write_text(f"Authorization: Bearer {BEARER}\n")
    (trial / "verifier" / "reward.txt").write_text("1\n")
    (trial / "artifacts" / "out.txt").write_text("escaped: " + json.dumps({"k": BEARER + '"'}))
    os.symlink("/etc/passwd", trial / "agent" / "link")
    return trial


def test_archive_scrubs_every_file_and_is_private(tmp_path: Path) -> None:
    trial = _trial(tmp_path)
    log = tmp_path / "harbor.log"
    log.write_text(f"OPENAI_API_KEY={BEARER}\n")
    dest = tmp_path / "rollout"
    report = archive_trial(trial, log, dest, [BEARER])
    assert "harbor/agent/link" in report.dropped  # symlinks are never followed or kept
    kept = [p for p in dest.rglob("*") if p.is_file()]
    assert {p.relative_to(dest).as_posix() for p in kept} >= {
        "harbor/result.json",
        "harbor/agent/log.txt",
        "harbor/verifier/reward.txt",
        "harbor/manifest.json",
        "artifacts/out.txt",
        "logs/harbor.log",
    }
    for path in kept:
        assert BEARER.encode() not in path.read_bytes(), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    manifest = json.loads((dest / "harbor" / "manifest.json").read_text())
    assert {e["path"] for e in manifest["files"]} >= {"result.json", "agent/log.txt"}
    assert all(len(e["sha256"]) == 64 and e["size_bytes"] > 0 for e in manifest["files"])


def test_scrub_fails_closed_when_a_secret_would_survive() -> None:
    spellings = secret_spellings([BEARER])
    assert scrub_bytes(f"x{BEARER}y".encode(), spellings) == b"x[REDACTED]y"
    # A secret the redaction itself spells again must refuse, never pass the bytes on.
    assert scrub_bytes(b"xREDAy", secret_spellings(["REDA"])) is None


def test_harbors_artifact_list_is_evidence_not_an_artifact(tmp_path: Path) -> None:
    trial = _trial(tmp_path)
    (trial / "artifacts" / "manifest.json").write_text('[{"source": "/logs/artifacts"}]')
    dest = tmp_path / "rollout"
    archive_trial(trial, None, dest, [BEARER])
    # The supervisor reserves artifacts/manifest.json (and skips it with a warning).
    assert not (dest / "artifacts" / "manifest.json").exists()
    assert (dest / "harbor" / "artifacts" / "manifest.json").read_text().startswith("[{")
    manifest = json.loads((dest / "harbor" / "manifest.json").read_text())
    assert "artifacts/manifest.json" in {e["path"] for e in manifest["files"]}
