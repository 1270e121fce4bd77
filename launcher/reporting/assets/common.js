// Shared by the report and diff pages. Everything is built with textContent: data never
// becomes markup. State lives in location.hash so a reload (live refresh) keeps the view.
"use strict";
const DATA = JSON.parse(document.getElementById("page-data").textContent);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value, digits) {
  if (value === undefined || value === null) return "–";
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  return value.toFixed(digits === undefined ? 3 : digits);
}

function readHash() {
  const state = {};
  for (const part of location.hash.replace(/^#/, "").split("&")) {
    if (!part) continue;
    const i = part.indexOf("=");
    if (i < 0) continue;
    // A hand-edited or truncated address may hold a malformed escape: that part is dropped,
    // the rest of the view still applies.
    try {
      state[decodeURIComponent(part.slice(0, i))] = decodeURIComponent(part.slice(i + 1));
    } catch (e) {
      if (!(e instanceof URIError)) throw e;
    }
  }
  return state;
}

function writeHash(state) {
  const parts = Object.entries(state)
    .filter(([, v]) => v !== "" && v !== undefined && v !== null)
    .map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(v));
  history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname);
}

function debounce(fn, ms) {
  let timer = 0;
  return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
}

function errorText(error) {
  if (!error) return "";
  const head = [error.phase, error.type].filter(Boolean).join(": ");
  if (error.message) return (head ? head + ": " : "") + error.message;
  return head || error.category || "";
}

function errorCategory(error) {
  return error ? error.category || error.type || "" : "";
}

function renderTranscript(steps) {
  if (!steps || !steps.length) return el("p", { class: "muted" }, "No trajectory.");
  return el("ol", { class: "transcript" }, steps.map((step) =>
    el("li", { class: "step src-" + step.source },
      el("div", { class: "role" }, step.source),
      step.message ? el("pre", { class: "msg" }, step.message) : null,
      (step.tool_calls || []).map((call) =>
        el("div", { class: "tool-call" },
          el("span", { class: "tool-name" }, "→ " + (call.name || "tool") + (call.id ? " [" + call.id + "]" : "")),
          el("pre", {}, call.arguments))),
      (step.observations || []).map((obs) =>
        el("div", { class: "tool-result" },
          el("span", { class: "tool-name" }, "← result" + (obs.call_id ? " [" + obs.call_id + "]" : "")),
          el("pre", {}, obs.content))))));
}

function statusBadge(status) {
  return el("span", { class: "badge st-" + status }, status);
}

// Paged table over an array of rows: only one page is ever in the DOM, so 10,000 items
// filter and sort without freezing the page.
function pagedTable(root, opts) {
  const state = { page: 0, size: opts.pageSize || 100, sortKey: opts.sortKey || "", sortDir: 1 };
  const tbody = el("tbody", { id: opts.bodyId || "rows" });
  const info = el("span", { class: "pager-info", id: "pager-info" });
  const prev = el("button", { type: "button", id: "prev-page", onclick: () => go(state.page - 1) }, "‹ prev");
  const next = el("button", { type: "button", id: "next-page", onclick: () => go(state.page + 1) }, "next ›");
  const heads = opts.columns.map((col) => el("th", {
    "data-key": col.key, class: col.sort ? "sortable" : null,
    onclick: col.sort ? () => sortBy(col.key) : null,
  }, col.label));
  const table = el("table", { class: "items" }, el("thead", {}, el("tr", {}, heads)), tbody);
  root.append(table, el("div", { class: "pager" }, prev, info, next));
  let rows = [];
  function sortBy(key) {
    state.sortDir = state.sortKey === key ? -state.sortDir : 1;
    state.sortKey = key;
    apply(rows, true);
    opts.onState && opts.onState();
  }
  function go(page) {
    const pages = Math.max(1, Math.ceil(rows.length / state.size));
    state.page = Number.isFinite(page) ? Math.min(Math.max(0, Math.trunc(page)), pages - 1) : 0;
    draw();
    opts.onState && opts.onState();
  }
  function draw() {
    const start = state.page * state.size;
    const slice = rows.slice(start, start + state.size);
    tbody.replaceChildren(...slice.map(opts.renderRow));
    const pages = Math.max(1, Math.ceil(rows.length / state.size));
    info.textContent = rows.length
      ? `${start + 1}–${start + slice.length} of ${rows.length.toLocaleString("en-US")} (page ${state.page + 1}/${pages})`
      : "no matching items";
    prev.disabled = state.page === 0;
    next.disabled = state.page >= pages - 1;
    for (const th of heads) {
      th.classList.toggle("sorted-asc", th.dataset.key === state.sortKey && state.sortDir > 0);
      th.classList.toggle("sorted-desc", th.dataset.key === state.sortKey && state.sortDir < 0);
    }
    opts.afterDraw && opts.afterDraw();
  }
  function apply(newRows, keepPage) {
    rows = newRows.slice();
    const col = state.sortKey ? opts.columns.find((c) => c.key === state.sortKey) : undefined;
    if (state.sortKey && !col) state.sortKey = "";  // a column this page does not have
    if (col) {
      const get = col.value;
      const dir = state.sortDir;
      rows.sort((a, b) => {
        const x = get(a), y = get(b);
        if (x === y) return 0;
        if (x === undefined || x === null) return 1;
        if (y === undefined || y === null) return -1;
        return (x < y ? -1 : 1) * dir;
      });
    }
    if (!keepPage) state.page = 0;
    go(state.page);
  }
  return { state, apply, go };
}
