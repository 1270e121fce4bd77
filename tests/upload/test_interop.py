"""The same finished run directory uploaded by osmosis-ai 0.3.8's own ``osmosis eval upload``
and by ``rollbridge eval upload``, each to a fresh recording stand-in of the platform: the two
request sequences are equal apart from version headers and the HTTP clients' own defaults, and
the stored bytes are identical (and are the run's files).

The reference runs in the cached Python 3.12 environment of the rollout-server interop test
(tests/rollout_server/interop_env.py); without Python 3.12 or the package the test skips.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.rollout_server.interop_env import NoPython312, interop_python
from tests.upload.helpers import client_env, ours, run, write_credentials
from tests.upload.rundir import expected_paths, make_workspace, write_finished_run
from tests.upload.standin import StandIn

pytestmark = [pytest.mark.interop, pytest.mark.slow]

NAME = "quiet-otter-7"
#: Headers that name a client or its version, or are the HTTP library's defaults
#: (urllib's and httpx's differ): not part of the protocol.
CLIENT_HEADERS = {
    "host",
    "user-agent",
    "x-osmosis-cli-version",
    "accept",
    "accept-encoding",
    "connection",
}


def _reference_python() -> str:
    try:
        return interop_python(("eval",))
    except NoPython312 as exc:
        pytest.skip(f"needs Python 3.12 for osmosis-ai 0.3.8: {exc}")
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        pytest.skip(f"needs osmosis-ai 0.3.8 installed in a Python 3.12 venv: {exc}")


def _sequence(stand_in: StandIn) -> list[tuple[Any, ...]]:
    return [
        (
            r.method,
            r.route,
            sorted(r.query.items()),
            sorted((k, v) for k, v in r.headers.items() if k not in CLIENT_HEADERS),
            r.body,
            r.status,
        )
        for r in stand_in.requests
    ]


async def _upload(
    tmp_path: Path, label: str, argv: list[str], nursery: trio.Nursery, **faults: list[str]
) -> tuple[StandIn, Path, str, str]:
    stand_in = StandIn(token="osm_pat_interop_TOKEN_0123456789")
    stand_in.faults.update(faults)
    await nursery.start(stand_in.serve)
    ws = make_workspace(tmp_path / label / "ws")
    run_dir = write_finished_run(ws / ".osmosis" / "evals", NAME)
    home = tmp_path / label / "home"
    write_credentials(home, stand_in.url, stand_in.token)
    done = await run(
        [*argv, "eval", "upload", NAME], cwd=ws, env=client_env(home, stand_in.url), limit_s=120
    )
    return stand_in, run_dir, done.stdout + done.stderr, str(done.returncode)


async def test_reference_and_ours_send_the_same_requests(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    python = await trio.to_thread.run_sync(_reference_python)
    reference, ref_dir, ref_out, ref_code = await _upload(
        tmp_path, "reference", [python, "-m", "osmosis_ai.cli.main"], nursery
    )
    assert ref_code == "0", ref_out
    mine, my_dir, my_out, my_code = await _upload(tmp_path, "ours", ours(), nursery)
    assert my_code == "0", my_out
    assert _sequence(mine) == _sequence(reference)
    assert mine.stored == reference.stored
    assert mine.stored == {p: (my_dir / p).read_bytes() for p in expected_paths(my_dir)}
    assert (my_dir / "logs.txt").read_bytes() == (ref_dir / "logs.txt").read_bytes()


async def test_the_409_message_is_the_reference_s(tmp_path: Path, nursery: trio.Nursery) -> None:
    python = await trio.to_thread.run_sync(_reference_python)
    messages = []
    for label, argv in (("reference", [python, "-m", "osmosis_ai.cli.main"]), ("ours", ours())):
        stand_in, run_dir, out, code = await _upload(tmp_path, label, argv, nursery)
        assert code == "0", out
        (run_dir / "logs.txt").write_text("a retried run's log\n")
        env = client_env(tmp_path / label / "home", stand_in.url)
        done = await run(
            [*argv, "eval", "upload", NAME], cwd=run_dir.parents[2], env=env, limit_s=120
        )
        assert done.returncode == 1
        # The reference also prints its status line ("Starting local evaluation upload...").
        messages.append([line for line in done.stderr.splitlines() if line.startswith("Error: ")])
    reference, mine = messages
    assert len(reference) == 1 and stand_in.conflict_message in reference[0]
    assert mine == [reference[0].replace("osmosis eval upload", "rollbridge eval upload")]
