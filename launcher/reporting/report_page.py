"""The report page of one run: summary, distributions, inputs and log rendered here; the item
table and the per-item view built in the browser by ``assets/report.js`` from inline data.

Every number the summary shows carries its exact value in a ``data-value`` attribute next to
the rounded text, so tests (and curious users) can compare it with ``metrics.json``.
"""

from __future__ import annotations

from typing import Any

from launcher.reporting.model import RunData
from launcher.reporting.page import esc, fmt_num, fmt_pct, render_page
from launcher.reporting.summary import Distribution, RunSummary, item_json, summarize

__all__ = ["REFRESH_SECONDS", "render_report"]

REFRESH_SECONDS = 5
_BAR_W, _BAR_H = 560, 140
#: Run totals of the calls' records, shown when the run has them (metrics.json summary keys).
_USAGE_CARDS = (
    ("calls", "model calls"),
    ("cached_tokens", "cached tokens"),
    ("cache_write_tokens", "cache-write tokens"),
    ("reasoning_tokens", "reasoning tokens"),
    ("retries", "retried calls"),
)


def _stat(key: str, label: str, value: Any, text: str) -> str:
    shown = "" if value is None else esc(value)
    return (
        f'<div class="stat" data-metric="{esc(key)}" data-value="{shown}">'
        f'<div class="stat-v">{esc(text)}</div><div class="stat-k">{esc(label)}</div></div>'
    )


def _summary_html(s: RunSummary, invocations: int = 1, extra: str = "") -> str:
    m = s.metrics
    cards = [
        _stat("status", "status", s.status, s.status),
        _stat(
            "pass_rate",
            f"pass rate ({m['passed']}/{m['completed_samples']}, skipped excluded)",
            m["pass_rate"],  # metrics.json's value, 0 when nothing is scored
            fmt_pct(s.pass_rate),
        ),
        _stat("total_samples", "items", m["total_samples"], s.progress),
        _stat("passed", "passed", m["passed"], fmt_num(m["passed"])),
        _stat("failed", "failed", m["failed"], fmt_num(m["failed"])),
        _stat("skipped", "skipped", m["skipped"], fmt_num(m["skipped"])),
        _stat("graded", "graded", m["graded"], fmt_num(m["graded"])),
        _stat("tokens_used", "total tokens", m["tokens_used"], fmt_num(m["tokens_used"])),
        *(
            _stat(key, label, m[key], fmt_num(m[key]))
            for key, label in _USAGE_CARDS
            if isinstance(m.get(key), int)
        ),
        _stat(
            "wall_ms",
            "wall time (s)" + (f", {invocations} invocations" if invocations > 1 else ""),
            s.wall_ms,
            fmt_num(s.wall_ms and s.wall_ms / 1000, 1),
        ),
    ]
    rewards = m.get("reward_stats")
    if isinstance(rewards, dict):
        for key in ("mean", "median", "std", "min", "max"):
            cards.append(
                _stat(f"reward_{key}", f"reward {key}", rewards[key], fmt_num(rewards[key]))
            )
    for point in m.get("pass_at_k", []):
        k = point["k"]
        cards.append(_stat(f"pass_at_{k}", f"pass@{k}", point["value"], fmt_pct(point["value"])))
    status_rows = "".join(
        f'<tr data-status="{esc(k)}"><td>{esc(k)}</td><td data-value="{v}">{v:,}</td></tr>'
        for k, v in s.by_status.items()
    )
    error_rows = (
        "".join(
            f'<tr data-error="{esc(k)}"><td>{esc(k)}</td><td data-value="{v}">{v:,}</td></tr>'
            for k, v in s.by_error.items()
        )
        or '<tr><td colspan="2" class="muted">no errors</td></tr>'
    )
    return (
        f'<section id="summary"><div class="stats">{"".join(cards)}</div>'
        '<div class="counts"><table class="small" id="by-status"><thead><tr><th>status</th>'
        f"<th>items</th></tr></thead><tbody>{status_rows}</tbody></table>"
        '<table class="small" id="by-error"><thead><tr><th>error category</th><th>items</th>'
        f"</tr></thead><tbody>{error_rows}</tbody></table>{extra}</div></section>"
    )


def _invocations_html(run: RunData) -> str:
    """Each invocation's start, wall time and end, under the summary (the wall time card is
    their total)."""
    if not run.invocations:
        return ""
    rows = "".join(
        f'<tr data-invocation="{n}" data-duration-ms="{esc(i.duration_ms if i.duration_ms is not None else "")}">'
        f"<td>{n}</td><td>{esc(i.started_at)}</td>"
        f'<td class="num">{"~" if i.approximate else ""}'
        f"{esc(fmt_num(i.duration_ms and i.duration_ms / 1000, 1))}</td>"
        f"<td>{esc(i.status)}</td></tr>"
        for n, i in enumerate(run.invocations, 1)
    )
    return (
        '<table class="small" id="invocations"><thead><tr><th>invocation</th><th>started</th>'
        f"<th>wall time (s)</th><th>ended</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _histogram_svg(d: Distribution, title: str) -> str:
    h = d.histogram
    peak = max(h.counts, default=0) or 1
    width = _BAR_W / max(len(h.counts), 1)
    bars = []
    for i, count in enumerate(h.counts):
        lo, hi = h.edges[i], h.edges[i + 1]
        bar_h = round(count / peak * (_BAR_H - 20), 1)
        bars.append(
            f'<rect class="bar" data-count="{count}" data-lo="{lo:g}" data-hi="{hi:g}" '
            f'x="{i * width + 1:.1f}" y="{_BAR_H - bar_h:.1f}" width="{max(width - 2, 1):.1f}" '
            f'height="{bar_h}"><title>{esc(f"{lo:g} – {hi:g}: {count} items")}</title></rect>'
        )
    axis = (
        f'<text x="0" y="{_BAR_H + 14}">{esc(fmt_num(h.edges[0]) if h.edges else "")}</text>'
        f'<text x="{_BAR_W}" y="{_BAR_H + 14}" text-anchor="end">'
        f"{esc(fmt_num(h.edges[-1]) if h.edges else '')}</text>"
    )
    stats = (
        f'<span data-metric="{d.label}_p50" data-value="{esc(d.p50 if d.p50 is not None else "")}">'
        f"p50 {esc(fmt_num(d.p50, 1))}</span> · "
        f'<span data-metric="{d.label}_p95" data-value="{esc(d.p95 if d.p95 is not None else "")}">'
        f"p95 {esc(fmt_num(d.p95, 1))}</span> · "
        f'<span data-metric="{d.label}_max" data-value="{esc(d.max if d.max is not None else "")}">'
        f"max {esc(fmt_num(d.max))}</span>"
        + (f" · {h.missing} without a value" if h.missing else "")
    )
    return (
        f'<figure class="hist" data-field="{d.label}" data-missing="{h.missing}">'
        f"<figcaption><b>{esc(title)}</b> {stats}</figcaption>"
        f'<svg viewBox="0 0 {_BAR_W} {_BAR_H + 18}" role="img" aria-label="{esc(title)}">'
        f"{''.join(bars)}{axis}</svg></figure>"
    )


def _inputs_html(run: RunData) -> str:
    inputs = run.inputs
    dataset = inputs.get("dataset") or {}
    rollout = inputs.get("rollout") or {}
    rows: list[tuple[str, Any]] = [
        ("run", run.name),
        ("directory", str(run.path)),
        ("model", inputs.get("model_path")),
        ("dataset", run.eval_run.get("dataset_name")),
        ("dataset sha256", dataset.get("sha256")),
        ("selected rows", dataset.get("selected_source_rows")),
        ("n (runs per row)", inputs.get("n")),
        ("rollout", f"{rollout.get('name')} ({rollout.get('entrypoint')})" if rollout else None),
        ("source digest", rollout.get("source_digest")),
        ("timeouts", inputs.get("timeouts")),
        ("env", inputs.get("env")),
        ("secret names", inputs.get("secret_names")),
        ("versions", inputs.get("versions")),
        ("started", run.eval_run.get("started_at")),
        ("completed", run.eval_run.get("completed_at")),
        ("pass threshold", run.pass_threshold),
    ]
    rows += [(f"provenance: {k}", v) for k, v in sorted(run.manifest.get("provenance", {}).items())]
    body = "".join(
        f"<tr><th>{esc(k)}</th><td><code>{esc(v)}</code></td></tr>"
        for k, v in rows
        if v not in (None, "", {}, [])
    )
    return f'<section id="inputs"><h2>Inputs</h2><table class="kv">{body}</table></section>'


def _log_html(run: RunData) -> str:
    note = " (last part only: the log is long)" if run.log_truncated else ""
    return (
        f'<section id="log"><details><summary>Log (logs.txt, redacted){esc(note)}</summary>'
        f'<pre class="log">{esc(run.log_text)}</pre></details></section>'
    )


def render_report(run: RunData, *, refresh: bool = False) -> str:
    """The report page of ``run``. With ``refresh`` and a run still ``running``, the page
    reloads itself every :data:`REFRESH_SECONDS` (keeping filters, search and selection)."""
    summary = summarize(run)
    threshold = run.pass_threshold
    data = {
        "kind": "report",
        "run": run.name,
        "status": summary.status,
        "threshold": threshold,
        "refresh": REFRESH_SECONDS if refresh and summary.status == "running" else 0,
        "items": [item_json(i, passed=i.passed(threshold)) for i in run.items],
        "rubrics": run.rubrics,
    }
    body = (
        f'<header><h1>{esc(run.name)}</h1><span class="badge st-{esc(summary.status)}">'
        f"{esc(summary.status)}</span>"
        f'<span class="muted">{esc(run.inputs.get("model_path", ""))}</span></header>'
        f"<main>{_summary_html(summary, len(run.invocations), _invocations_html(run))}"
        '<section id="distributions"><h2>Distributions</h2><div class="hists">'
        f"{_histogram_svg(summary.tokens, 'Tokens per rollout')}"
        f"{_histogram_svg(summary.context, 'Context length (max_context_tokens)')}"
        f"{_histogram_svg(summary.duration, 'Duration (ms)')}</div></section>"
        '<section id="items-section"><h2>Items</h2><div id="table-root"></div></section>'
        f'<section id="detail" hidden></section>{_inputs_html(run)}{_log_html(run)}</main>'
    )
    return render_page(
        title=f"rollbridge report: {run.name}", body=body, data=data, script="report.js"
    )
