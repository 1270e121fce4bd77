"""The progress display of ``rollbridge eval run`` as a user reads it: done/total counts kept
results on resume and ``--retry-failed``, the summary names pass rate (skipped excluded), rate,
ETA, in flight and tokens, a piped run prints one line per finished item, and a bar closed by
Ctrl-C keeps its true count. Plus the stage line and Duration cell the supervisor shows."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import pytest

from launcher.report import complete_duration, pending_line
from launcher.rundir.metrics import LiveCounters
from launcher.ui import UI


@dataclass
class FakeCounters:
    """Just what the display reads."""

    completed: int = 0
    failed: int = 0
    skipped: int = 0
    tokens: int = 0
    pass_rate: float = 0.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line.strip()]


def test_piped_output_is_one_line_per_item_with_rate_eta_in_flight_and_tokens() -> None:
    out, clock = io.StringIO(), FakeClock()
    ui = UI("rich", stdout=out, stderr=io.StringIO(), clock=clock)
    counters = FakeCounters()
    in_flight = [4]
    ui.open_progress(30, counters, 30, lambda: in_flight[0])
    for i in range(3):
        clock.now += 2.0
        counters.completed += 1
        counters.tokens += 1500
        counters.pass_rate = 1.0
        ui.progress_update(f"row {i} run 0: success, reward 1")
    in_flight[0] = 3
    ui.progress_update()
    ui.close_progress()
    lines = _lines(out)
    assert lines[0] == "0/30 pass 0% · failed 0 · 4 in flight"
    # 3 results in 6 s: 30/min, 27 left -> 54 s.
    assert lines[3] == (
        "3/30 pass 100% · failed 0 · 30.0/min · ETA 0:54 · 4 in flight · 4,500 tokens"
        " · row 2 run 0: success, reward 1"
    )
    assert [line.split(" · row ")[1] for line in lines[1:4]] == [
        f"{i} run 0: success, reward 1" for i in range(3)
    ]
    assert lines[4].startswith("3/30 ") and "3 in flight" in lines[4]
    assert len(lines) == 5


def test_piped_output_never_shows_more_in_flight_than_is_left() -> None:
    out, clock = io.StringIO(), FakeClock()
    ui = UI("rich", stdout=out, stderr=io.StringIO(), clock=clock)
    counters = FakeCounters()
    # The last worker is still counted in flight when its result is shown.
    ui.open_progress(2, counters, 2, lambda: 2 - counters.completed + 1)
    for i in range(2):
        clock.now += 1.0
        counters.completed += 1
        ui.progress_update(f"row {i} run 0: success")
    ui.close_progress()
    lines = _lines(out)
    assert "1 in flight" in lines[1]
    assert lines[2].startswith("2/2 ") and "in flight" not in lines[2]


def test_cancelling_replaces_eta_and_in_flight() -> None:
    out, clock = io.StringIO(), FakeClock()
    ui = UI("rich", stdout=out, stderr=io.StringIO(), clock=clock)
    counters = FakeCounters()
    in_flight = [4]
    ui.open_progress(10, counters, 10, lambda: in_flight[0])
    clock.now += 1.0
    counters.completed += 1
    ui.progress_update("row 0 run 0: success")
    ui.progress_stopping("cancelling")  # what the first Ctrl-C does
    in_flight[0] = 1
    clock.now += 1.0
    counters.completed += 1
    ui.progress_update("row 1 run 0: failed")
    in_flight[0] = 0
    ui.progress_update()
    lines = _lines(out)
    assert "ETA" in lines[1] and "4 in flight" in lines[1]
    assert lines[2].endswith(" · cancelling: 4 left")
    assert "ETA" not in lines[2] and "in flight" not in lines[2]
    assert "cancelling: 1 left · row 1 run 0: failed" in lines[3]
    assert lines[4].endswith(" · cancelling")


def test_retry_failed_counts_kept_results_as_done() -> None:
    out = io.StringIO()
    ui = UI("rich", stdout=out, stderr=io.StringIO(), clock=FakeClock())
    # 30 recorded, 2 of them failed and re-run now: the bar starts at the 28 kept.
    counters = FakeCounters(completed=30, failed=2, skipped=1, pass_rate=27 / 29)
    ui.open_progress(30, counters, 2)
    ui.progress_update("row 4 run 0: success, reward 1")
    ui.close_progress()
    lines = _lines(out)
    assert lines[0] == "28/30 pass 93% · failed 2 · skipped 1"
    assert lines[1].startswith("29/30 ")


def test_plain_and_json_print_no_progress() -> None:
    for mode in ("plain", "json"):
        out = io.StringIO()
        ui = UI(mode, stdout=out, stderr=io.StringIO())
        ui.open_progress(3, FakeCounters(), 3)
        ui.progress_update("row 0 run 0: success")
        ui.close_progress()
        assert out.getvalue() == ""


def test_a_bar_closed_early_keeps_its_true_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out, clock = TTY(), FakeClock()
    ui = UI("rich", stdout=out, stderr=io.StringIO(), clock=clock)
    counters = FakeCounters()
    ui.open_progress(30, counters, 30, lambda: 2)
    for i in range(6):
        clock.now += 1.0
        counters.completed += 1
        ui.progress_update(f"row {i} run 0: success")
    ui.close_progress()  # what Ctrl-C does
    final = ANSI.sub("", out.getvalue()).replace("\r", "\n").splitlines()
    final = [line for line in final if "rollouts" in line][-1]
    assert " 6/30 " in final and "stopped" in final
    assert "ETA" not in final and "in flight" not in final
    assert "6/6" not in out.getvalue()


def test_live_counters_count_tokens_of_the_latest_record() -> None:
    counters = LiveCounters(pass_threshold=1.0)
    counters.apply("failed", None, tokens=100)
    counters.apply("success", 1.0, tokens=50)
    counters.apply("success", 1.0, ("failed", None, 100), tokens=70)
    assert (counters.tokens, counters.completed, counters.failed) == (120, 2, 0)
    counters.apply("success", 1.0, ("success", 1.0))  # an old-style replacement: no tokens
    assert counters.tokens == 120


def test_pending_line_says_what_is_kept_and_what_is_re_run() -> None:
    assert pending_line("r", 30, 30, 0) == "r: 30 of 30 work items pending"
    assert pending_line("r", 24, 30, 6) == "r: 24 of 30 work items pending, 6 already recorded"
    assert pending_line("r", 2, 30, 30) == (
        "r: 2 of 30 work items pending, 30 already recorded (28 kept, 2 to re-run)"
    )
    # 3 never ran, 2 failed: 5 pending, 25 kept.
    assert pending_line("r", 5, 30, 27).endswith("27 already recorded (25 kept, 2 to re-run)")


def test_already_complete_duration_is_the_recorded_one() -> None:
    assert complete_duration({"eval_run": {"duration_ms": 4200.0}}) == (
        "4.2s when it ran (already complete, nothing ran now)"
    )
    assert complete_duration({}) == "already complete, nothing ran now"
    assert "0s" not in complete_duration({"eval_run": {"duration_ms": 0}})


def test_in_flight_names_the_limit_while_adaptive_concurrency_lowers_it() -> None:
    """Issue 27 item 12: the current limit is shown while it is below the configured one."""
    out = io.StringIO()
    ui = UI("rich", stdout=out, stderr=io.StringIO(), clock=FakeClock())
    limit: list[int | None] = [4]
    ui.open_progress(30, FakeCounters(), 30, lambda: 3, lambda: limit[0])
    limit[0] = None
    ui.progress_update()
    ui.close_progress()
    assert _lines(out) == [
        "0/30 pass 0% · failed 0 · 3 in flight (limit 4)",
        "0/30 pass 0% · failed 0 · 3 in flight",
    ]


def test_a_warning_during_the_live_view_is_printed_above_it_not_across_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    terminal, clock = TTY(), FakeClock()  # stdout and stderr on one terminal
    ui = UI("rich", stdout=terminal, stderr=terminal, clock=clock)
    counters = FakeCounters()
    ui.open_progress(30, counters, 30, lambda: 2)
    counters.completed += 1
    ui.progress_update("row 0 run 0: success")
    ui.warning("node n2 refused: its replica did not start")
    counters.completed += 1
    ui.progress_update("row 1 run 0: success")
    ui.close_progress()
    before, _, after = terminal.getvalue().partition("⚠ node n2 refused")
    # The view erased its own lines first, so the warning starts a line of its own.
    assert before.endswith("\r\x1b[2K\x1b[33m"), repr(before[-60:])
    assert after.startswith(": its replica did not start")
    # Piped stderr: the warning goes there, whatever stdout is.
    out, err = TTY(), io.StringIO()
    ui = UI("rich", stdout=out, stderr=err, clock=clock)
    ui.open_progress(30, counters, 30, lambda: 2)
    ui.warning("to the log")
    ui.close_progress()
    assert "to the log" in err.getvalue() and "to the log" not in out.getvalue()
