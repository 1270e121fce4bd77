// The report page: item table (filter by status, search over prompt and ground truth, sort,
// pages) and the detail view of one item (error, prompt, transcript, diagnostics).
"use strict";
(function () {
  const items = DATA.items;
  // One lowercase haystack per item, built once, so a search over 10,000 items is one pass.
  const haystacks = items.map((it) =>
    [it.prompt, it.label, it.id, errorText(it.error)].filter(Boolean).join("\n").toLowerCase());
  const hash = readHash();
  const root = document.getElementById("table-root");
  const detail = document.getElementById("detail");
  const statusSelect = el("select", { id: "status-filter", "aria-label": "filter by status" },
    [["", "all statuses"], ["success", "success"], ["failed", "failed"], ["skipped", "skipped"],
     ["passed", "passed"], ["not-passed", "not passed"]].map(([v, t]) => el("option", { value: v }, t)));
  const search = el("input", { id: "search", type: "search", placeholder: "search prompt, ground truth, error…", "aria-label": "search" });
  const count = el("span", { id: "match-count", class: "muted" });
  root.append(el("div", { class: "controls" }, statusSelect, search, count));
  let selected = hash.sel || "";

  const columns = [
    { key: "row", label: "row", sort: true, value: (i) => i.row },
    { key: "run", label: "run", sort: true, value: (i) => i.run },
    { key: "status", label: "status", sort: true, value: (i) => i.status },
    { key: "reward", label: "reward", sort: true, value: (i) => i.reward },
    { key: "tokens", label: "tokens", sort: true, value: (i) => i.tokens },
    { key: "context", label: "context", sort: true, value: (i) => i.context },
    { key: "duration_ms", label: "duration ms", sort: true, value: (i) => i.duration_ms },
    ...(DATA.rubrics || []).map((judge) => ({
      key: "rubric:" + judge, label: "rubric " + judge, sort: true,
      value: (i) => (i.rubric && judge in i.rubric ? i.rubric[judge] : null),
    })),
    { key: "category", label: "error category", sort: true, value: (i) => errorCategory(i.error) || null },
    { key: "error", label: "error", sort: false, value: (i) => errorText(i.error) },
  ];
  // The detail opens in a row of its own right under the clicked row; when that row is not
  // on the page (filtered out, another page) it waits in its own section under the table.
  const home = detail.parentNode, homeNext = detail.nextSibling;
  const detailRow = el("tr", { class: "detail-row" }, el("td", { colspan: columns.length }));
  function place() {
    const tr = selected && !detail.hidden
      ? [...document.querySelectorAll("#item-rows tr.item")].find((r) => r.dataset.id === selected)
      : null;
    if (tr) {
      detailRow.firstChild.append(detail);
      tr.after(detailRow);
    } else {
      detailRow.remove();
      home.insertBefore(detail, homeNext);
    }
  }
  const table = pagedTable(root, {
    columns, bodyId: "item-rows", pageSize: 100, onState: saveState, afterDraw: place,
    renderRow: (it) => el("tr", {
      class: "item" + (it.id === selected ? " selected" : "") + (it.passed ? " passed" : ""),
      "data-id": it.id, "data-status": it.status, onclick: () => select(it.id),
    },
      el("td", {}, it.row), el("td", {}, it.run), el("td", {}, statusBadge(it.status)),
      el("td", { class: "num" }, fmt(it.reward)), el("td", { class: "num" }, fmt(it.tokens)),
      el("td", { class: "num" }, fmt(it.context)), el("td", { class: "num" }, fmt(it.duration_ms, 0)),
      ...(DATA.rubrics || []).map((judge) =>
        el("td", { class: "num rubric" }, fmt(it.rubric && judge in it.rubric ? it.rubric[judge] : null))),
      el("td", {}, errorCategory(it.error)),
      el("td", { class: "error-text" }, errorText(it.error))),
  });

  function matches() {
    const status = statusSelect.value;
    const q = search.value.trim().toLowerCase();
    const out = [];
    for (let i = 0; i < items.length; i++) {
      const it = items[i];
      if (status === "passed" && !it.passed) continue;
      if (status === "not-passed" && (it.passed || it.status === "skipped")) continue;
      if (status && status !== "passed" && status !== "not-passed" && it.status !== status) continue;
      if (q && !haystacks[i].includes(q)) continue;
      out.push(it);
    }
    return out;
  }
  function refilter(keepPage) {
    const rows = matches();
    count.textContent = rows.length === items.length ? `${items.length.toLocaleString("en-US")} items`
      : `${rows.length.toLocaleString("en-US")} of ${items.length.toLocaleString("en-US")} items`;
    table.apply(rows, keepPage);
  }
  function saveState() {
    writeHash({ status: statusSelect.value, q: search.value, page: table.state.page || "",
      sort: table.state.sortKey, dir: table.state.sortDir < 0 ? "desc" : "", sel: selected });
  }
  function select(id) {
    selected = id;
    const it = items.find((x) => x.id === id);
    for (const tr of document.querySelectorAll("#item-rows tr")) tr.classList.toggle("selected", tr.dataset.id === id);
    if (!it) { detail.hidden = true; place(); saveState(); return; }
    detail.hidden = false;
    detail.replaceChildren(
      el("h2", {}, `Item row ${it.row}, run ${it.run} `, statusBadge(it.status),
        el("button", { type: "button", class: "close", onclick: () => select("") }, "close")),
      el("p", { class: "muted" }, "rollout ", el("code", {}, it.id),
        ` · reward ${fmt(it.reward)} · tokens ${fmt(it.tokens)} · context ${fmt(it.context)} · ${fmt(it.duration_ms, 0)} ms`),
      // replaceChildren, unlike el(), would print a null child as the text "null".
      it.error ? el("div", { class: "error-box", id: "detail-error" }, errorText(it.error)) : "",
      el("h3", {}, "Prompt"), el("pre", { class: "msg" }, it.prompt || "–"),
      el("h3", {}, "Ground truth"), el("pre", { class: "msg" }, it.label === undefined ? "–" : it.label),
      el("h3", {}, "Transcript"), renderTranscript(it.transcript),
      el("h3", {}, "Model calls"), renderCalls(it.calls, it.usage),
      el("h3", {}, "Diagnostics"),
      it.diagnostics ? el("pre", { class: "msg diagnostics" }, JSON.stringify(it.diagnostics, null, 2)) : el("p", { class: "muted" }, "none"));
    place();
    saveState();
  }

  statusSelect.value = hash.status || "";
  search.value = hash.q || "";
  statusSelect.addEventListener("change", () => refilter(false));
  search.addEventListener("input", debounce(() => refilter(false), 120));
  if (hash.sort) { table.state.sortKey = hash.sort; table.state.sortDir = hash.dir === "desc" ? -1 : 1; }
  table.state.page = Number(hash.page || 0);
  refilter(true);
  if (selected) select(selected);
  if (DATA.refresh > 0) setTimeout(() => location.reload(), DATA.refresh * 1000);
  window.rbReadyMs = performance.now();
  document.body.dataset.ready = "1";
})();

// One item's model calls as a timeline: a bar per call from its start to its end (the darker
// part is the wait for the first byte), and beside it latency, tokens, cached share, retries.
function renderCalls(calls, usage) {
  const totals = usage ? Object.entries(usage).filter(([k]) => k !== "metrics")
    .map(([k, v]) => `${k.replace("_", " ")} ${fmt(v)}`).join(" · ") : "";
  const metrics = usage && usage.metrics ? "workflow metrics " + JSON.stringify(usage.metrics) : "";
  const head = [totals, metrics].filter(Boolean).map((t) => el("p", { class: "muted" }, t));
  if (!calls || !calls.length) return el("div", { id: "detail-calls" }, head, el("p", { class: "muted" }, "No call records."));
  const span = Math.max(1, ...calls.map((c) => (c.start_ms || 0) + (c.duration_ms || 0)));
  const pct = (ms) => (100 * ms / span).toFixed(2) + "%";
  return el("div", { id: "detail-calls" }, head, el("ol", { class: "calls" }, calls.map((c) => {
    const cached = c.cached_tokens !== undefined && c.prompt_tokens
      ? ` · cached ${fmt(c.cached_tokens)} (${Math.round(100 * c.cached_tokens / c.prompt_tokens)}%)` : "";
    const facts = `#${c.index !== undefined ? c.index : "?"} · ${fmt(c.duration_ms, 0)} ms (first byte ${fmt(c.ttfb_ms, 0)}) · `
      + `${fmt(c.prompt_tokens)} → ${fmt(c.completion_tokens)} tokens${cached}`
      + (c.reasoning_tokens !== undefined ? ` · reasoning ${fmt(c.reasoning_tokens)}` : "")
      + (c.retries ? ` · ${c.retries} retried: ${c.retry_causes.join(", ")}` : "")
      + ` · ${c.status === 200 ? (c.finish_reason || "ok") : "HTTP " + fmt(c.status) + (c.error ? " " + c.error : "")}`;
    return el("li", { class: "call" + (c.status === 200 ? "" : " call-failed"), "data-index": c.index },
      el("div", { class: "call-track" },
        el("div", { class: "call-bar", style: `margin-left:${pct(c.start_ms || 0)};width:${pct(c.duration_ms || 0)}` },
          el("div", { class: "call-wait", style: `width:${c.duration_ms ? (100 * (c.ttfb_ms || 0) / c.duration_ms).toFixed(1) : 0}%` }))),
      el("div", { class: "call-facts" }, facts));
  })));
}
