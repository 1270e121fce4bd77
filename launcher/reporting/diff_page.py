"""The diff page: the paired numbers rendered here, the flipped items (with both transcripts
side by side) built in the browser by ``assets/diff.js``."""

from __future__ import annotations

from typing import Any

from launcher.reporting.diff import DiffResult
from launcher.reporting.page import esc, fmt_num, fmt_pct, render_page
from launcher.reporting.summary import item_json

__all__ = ["diff_rows", "render_diff"]


def _ci(reward: dict[str, Any]) -> str:
    ci = reward.get("ci95")
    return "–" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _delta(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:+,.{digits}f}"


def diff_rows(d: DiffResult) -> list[tuple[str, str, str, str]]:
    """The table the terminal and the page show: (what, A, B, B − A)."""
    pr = d.pass_rate
    both = pr["a"] is not None and pr["b"] is not None
    pr_delta = f"{_delta((pr['b'] or 0) - (pr['a'] or 0), 3)}" if both else "–"
    r, t, c, k = d.reward, d.tokens, d.context, d.calls
    return [
        ("paired items (scored)", f"{d.pairs:,} ({d.scored_pairs:,})", "", ""),
        (
            "pass rate (scored pairs)",
            fmt_pct(pr["a"]),
            fmt_pct(pr["b"]),
            pr_delta,
        ),
        ("flips pass→fail / fail→pass", "", "", f"{d.pass_to_fail:,} / {d.fail_to_pass:,}"),
        ("McNemar exact p", "", "", f"{d.mcnemar_p:.4g}"),
        (
            "mean reward (graded pairs)",
            fmt_num(r["mean_a"]),
            fmt_num(r["mean_b"]),
            _delta(r["mean_delta"]),
        ),
        ("reward delta 95% CI (paired bootstrap)", "", "", _ci(r)),
        (
            f"mean tokens ({t['pairs']:,} pairs with tokens on both sides)",
            fmt_num(t["mean_a"], 1),
            fmt_num(t["mean_b"], 1),
            _delta(t["mean_delta"], 1),
        ),
        (
            f"total tokens of those {t['pairs']:,} pairs",
            fmt_num(t["total_a"], 0),
            fmt_num(t["total_b"], 0),
            _delta(t["total_b"] - t["total_a"], 0),
        ),
        (
            "total tokens, every item of each run",
            fmt_num(t["all_total_a"], 0),
            fmt_num(t["all_total_b"], 0),
            _delta(t["all_total_b"] - t["all_total_a"], 0),
        ),
        *(
            [
                (
                    f"mean model calls ({k['pairs']:,} pairs with calls on both sides)",
                    fmt_num(k["mean_a"], 2),
                    fmt_num(k["mean_b"], 2),
                    _delta(k["mean_delta"], 2),
                ),
                (
                    "total model calls, every item of each run",
                    fmt_num(k["all_total_a"], 0),
                    fmt_num(k["all_total_b"], 0),
                    _delta(k["all_total_b"] - k["all_total_a"], 0),
                ),
            ]
            if k["all_items_a"] or k["all_items_b"]
            else []
        ),
        (
            "mean context",
            fmt_num(c["mean_a"], 1),
            fmt_num(c["mean_b"], 1),
            _delta(c["mean_delta"], 1),
        ),
        (
            "p95 / max context",
            f"{fmt_num(c['p95_a'], 0)} / {fmt_num(c['max_a'])}",
            f"{fmt_num(c['p95_b'], 0)} / {fmt_num(c['max_b'])}",
            "",
        ),
        ("only in A / only in B", f"{d.only_a:,}", f"{d.only_b:,}", ""),
    ]


def render_diff(d: DiffResult) -> str:
    """The diff page of ``d``."""
    table = "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(a)}</td><td>{esc(b)}</td><td>{esc(delta)}</td></tr>"
        for k, a, b, delta in diff_rows(d)
    )
    numbers = d.to_json()
    changes = ", ".join(d.other_changes) or "nothing (same inputs)"
    data = {
        "kind": "diff",
        "numbers": numbers,
        "flips": [
            {
                "direction": f.direction,
                "a": item_json(f.a, passed=f.a.passed(d.a.pass_threshold)),
                "b": item_json(f.b, passed=f.b.passed(d.b.pass_threshold)),
            }
            for f in d.flips
        ],
    }
    body = (
        f"<header><h1>{esc(d.a.name)} → {esc(d.b.name)}</h1>"
        f'<span class="muted">inputs that differ: {esc(changes)}</span></header><main>'
        '<section id="numbers"><h2>Paired comparison</h2><table class="kv" id="diff-table">'
        f"<thead><tr><th></th><th>A: {esc(d.a.name)}</th><th>B: {esc(d.b.name)}</th>"
        f"<th>B − A</th></tr></thead><tbody>{table}</tbody></table>"
        '<p class="muted">Items pair by (row, run). Pass as metrics.json counts it; pairs with '
        "a skipped side are not scored. The interval resamples pairs (2,000 resamples, fixed "
        "seed).</p></section>"
        '<section id="flips-section"><h2>Flipped items</h2><div id="flips-root"></div></section>'
        '<section id="detail" hidden></section></main>'
    )
    return render_page(
        title=f"rollbridge diff: {d.a.name} vs {d.b.name}", body=body, data=data, script="diff.js"
    )
