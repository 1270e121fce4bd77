// The diff page: the flipped items, filterable by direction, and one flip's two transcripts
// side by side.
"use strict";
(function () {
  const flips = DATA.flips;
  const root = document.getElementById("flips-root");
  const detail = document.getElementById("detail");
  const direction = el("select", { id: "direction-filter", "aria-label": "filter by direction" },
    [["", "both directions"], ["pass→fail", "pass→fail"], ["fail→pass", "fail→pass"]].map(([v, t]) => el("option", { value: v }, t)));
  root.append(el("div", { class: "controls" }, direction));
  const table = pagedTable(root, {
    bodyId: "flip-rows", pageSize: 100,
    columns: [
      { key: "row", label: "row", sort: true, value: (f) => f.a.row },
      { key: "run", label: "run", sort: true, value: (f) => f.a.run },
      { key: "direction", label: "flip", sort: true, value: (f) => f.direction },
      { key: "ra", label: "reward A", sort: true, value: (f) => f.a.reward },
      { key: "rb", label: "reward B", sort: true, value: (f) => f.b.reward },
      { key: "err", label: "error (failing side)", sort: false, value: () => "" },
    ],
    renderRow: (f) => el("tr", { class: "item", "data-row": f.a.row, "data-run": f.a.run, onclick: () => show(f) },
      el("td", {}, f.a.row), el("td", {}, f.a.run), el("td", {}, f.direction),
      el("td", { class: "num" }, fmt(f.a.reward)), el("td", { class: "num" }, fmt(f.b.reward)),
      el("td", { class: "error-text" }, errorText((f.direction === "pass→fail" ? f.b : f.a).error))),
  });
  function side(title, it) {
    return el("div", {},
      el("h3", {}, title + " ", statusBadge(it.status), ` reward ${fmt(it.reward)} · tokens ${fmt(it.tokens)}`),
      it.error ? el("div", { class: "error-box" }, errorText(it.error)) : null,
      renderTranscript(it.transcript));
  }
  function show(f) {
    detail.hidden = false;
    detail.replaceChildren(
      el("h2", {}, `Row ${f.a.row}, run ${f.a.run}: ${f.direction}`,
        el("button", { type: "button", class: "close", onclick: () => { detail.hidden = true; } }, "close")),
      el("h3", {}, "Prompt"), el("pre", { class: "msg" }, f.a.prompt || "–"),
      el("h3", {}, "Ground truth"), el("pre", { class: "msg" }, f.a.label === undefined ? "–" : f.a.label),
      el("div", { class: "sides" }, side("A: " + DATA.numbers.a.name, f.a), side("B: " + DATA.numbers.b.name, f.b)));
  }
  function refilter() {
    const want = direction.value;
    table.apply(want ? flips.filter((f) => f.direction === want) : flips, false);
  }
  direction.addEventListener("change", refilter);
  refilter();
  window.rbReadyMs = performance.now();
  document.body.dataset.ready = "1";
})();
