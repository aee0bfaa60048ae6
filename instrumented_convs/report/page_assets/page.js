/* The page of a run (instrumented_convs/report/page.py inlines this file): an icicle of the step
 * tree, forward and backward, the table, the ranks' spread, and two runs side by side for a
 * diff. Reads the JSON in <script id="data">; no network, no library. */
"use strict";
(function () {
  const errors = [];
  function showErrors() {
    const box = document.getElementById("errors");
    if (box) box.textContent = errors.join("\n");
    document.body.dataset.errors = String(errors.length);
  }
  window.addEventListener("error", function (e) { errors.push(String(e.message)); showErrors(); });

  const DATA = JSON.parse(document.getElementById("data").textContent);
  const SCALE = { s: 1, ms: 1e3, us: 1e6, ns: 1e9 };
  const BLUES = ["#2f5f8f", "#4e79a7", "#6b93c4", "#8fb0d9", "#aac4e4"];
  const ORANGES = ["#b35c00", "#e07b1a", "#f0973f", "#f5b26b", "#f9cc9a"];
  const GREY = "#7f7f7f";
  const SVGNS = "http://www.w3.org/2000/svg";

  function fmt(seconds, unit) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
    const v = seconds * SCALE[unit];
    const a = Math.abs(v);
    return a >= 100 ? v.toFixed(1) : a >= 1 ? v.toFixed(3) : a === 0 ? "0" : v.toPrecision(3);
  }
  function fmtBytes(n) {
    if (n === null || n === undefined || !isFinite(n)) return "";
    const units = [[1099511627776, "TiB"], [1073741824, "GiB"], [1048576, "MiB"], [1024, "KiB"]];
    for (const u of units) {
      const v = n / u[0];
      if (Math.abs(n) >= u[0]) return (Math.abs(v) < 1000 ? v.toPrecision(3) : v.toFixed(0)) + " " + u[1];
    }
    return Math.round(n) + " B";
  }
  // a row's host time over all its calls: where only some calls' was read, their mean times
  // the calls (report/row.py's host_estimate)
  function hostEstimate(n) {
    return n.device_calls > 0 && n.device_calls < n.count ? n.host * n.count / n.device_calls : n.host;
  }
  function pct(x) { return x === null || x === undefined ? "" : (100 * x).toFixed(1) + "%"; }
  function node(tag, attrs, text) {
    const n = document.createElement(tag);
    for (const k in attrs || {}) n.setAttribute(k, attrs[k]);
    if (text !== undefined) n.textContent = text;
    return n;
  }
  function label(r) {
    return r.step + (r.phase === "backward" ? " [backward]" : "") + (r.kind === "upstream" ? " (upstream code)" : "");
  }

  /* The tree of a summary's rows: a backward row nests under the row of its parent path in
   * its own phase and scope when there is one, else in the forward phase, else unscoped. */
  function tree(rows) {
    const key = function (name, phase, scope) { return name + "\u0000" + phase + "\u0000" + (scope || ""); };
    const nodes = new Map();
    const root = { name: "", step: "all", phase: "forward", kind: "root", total: 0, children: [], parent: null };
    rows = rows.filter(function (r) { return r.kind !== "tool"; });  /* the tool's own: in the table only */
    for (const r of rows) nodes.set(key(r.name, r.phase, r.scope), Object.assign({ children: [] }, r));
    for (const r of rows) {
      const n = nodes.get(key(r.name, r.phase, r.scope));
      const cut = r.name.lastIndexOf("/");
      let p = null;
      if (cut > 0) {
        const up = r.name.slice(0, cut);
        const tries = [[r.phase, r.scope], ["forward", r.scope], [r.phase, null], ["forward", null]];
        for (const t of tries) { p = nodes.get(key(up, t[0], t[1])); if (p) break; }
      }
      n.parent = p || root;
      n.parent.children.push(n);
    }
    root.total = root.children.reduce(function (s, c) { return s + c.total; }, 0);
    return root;
  }

  function colour(n) {
    if (n.kind === "root") return "#444";
    if (n.kind === "region" && n.phase !== "backward") return GREY;
    const ramp = n.phase === "backward" ? ORANGES : BLUES;
    return ramp[Math.min(Math.max(n.depth, 0), ramp.length - 1)];
  }

  const tip = node("div", { id: "tip" });
  function showTip(e, n, unit, grand) {
    if (unit === "bytes") {
      tip.textContent = n.kind === "root" ? "all steps kept " + fmtBytes(n.total) + " (click to zoom out)" :
        (n.name + (n.scope ? "  (" + n.scope + ")" : "") + "\n" + n.count + " calls, each keeps " +
         fmtBytes(n.mean) + " for backward (" + fmtBytes(n.total) + " in all, its own " +
         fmtBytes(n.self_time) + "), peak " + fmtBytes(n.peak) + "\n" + pct(n.total / grand) +
         " of what all steps kept");
    } else if (n.kind === "root") {
      tip.textContent = "all steps: " + fmt(n.total, unit) + " " + unit + " (click to zoom out)";
    } else {
      tip.textContent = (n.name + (n.phase === "backward" ? " [backward]" : "") +
        (n.scope ? "  (" + n.scope + ")" : "") + "\n" + n.count + " calls" +
        (n.estimated ? " (" + n.estimated + " estimated)" : "") + ", total " + fmt(n.total, unit) +
        " " + unit + ", mean " + fmt(n.mean, unit) + " " + unit + ", self " +
        fmt(n.self_time, unit) + " " + unit + (n.device_calls ? ", host " + fmt(hostEstimate(n), unit) +
        " " + unit + " (total is the device's)" : "") + "\n" + pct(n.total / grand) + " of all steps");
    }
    tip.style.whiteSpace = "pre";
    tip.style.display = "block";
    tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 300) + "px";
    tip.style.top = (e.clientY + 14) + "px";
  }

  /* An icicle: one band per depth, each step as wide as its total (a share of its parent's
   * width; its own code is the gap its children leave). Click a step to zoom, "all" to return. */
  function icicle(box, rows, unit, scaleTotal) {
    const root = tree(rows);
    const W = Math.max(box.clientWidth || 0, 300), H = 22;
    let focus = root;
    let deepest = 0;
    (function walk(n, d) { deepest = Math.max(deepest, d); n.children.forEach(function (c) { walk(c, d + 1); }); })(root, 0);
    const svg = document.createElementNS(SVGNS, "svg");
    svg.setAttribute("class", "icicle");
    svg.setAttribute("viewBox", "0 0 " + W + " " + (deepest + 1) * H);
    svg.setAttribute("height", String((deepest + 1) * H));
    box.appendChild(svg);
    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      let count = 0;
      const width = focus === root ? W * (scaleTotal > 0 ? root.total / scaleTotal : 1) : W;
      const start = focus === root ? 0 : 1;
      function place(n, x, w, d) {
        if (w < 0.5) return;
        const g = document.createElementNS(SVGNS, "g");
        const r = document.createElementNS(SVGNS, "rect");
        r.setAttribute("x", x.toFixed(2));
        r.setAttribute("y", d * H);
        r.setAttribute("width", Math.max(w - 0.5, 0.5).toFixed(2));
        r.setAttribute("height", H - 1);
        r.setAttribute("fill", colour(n));
        r.addEventListener("mousemove", function (e) { showTip(e, n, unit, root.total); });
        r.addEventListener("mouseleave", function () { tip.style.display = "none"; });
        r.addEventListener("click", function () { focus = n === focus || n.kind === "root" ? root : n; draw(); });
        g.appendChild(r);
        count++;
        if (w > 36) {
          const t = document.createElementNS(SVGNS, "text");
          t.setAttribute("x", (x + 4).toFixed(2));
          t.setAttribute("y", d * H + 15);
          const room = Math.floor((w - 8) / 6.5);
          const all = unit === "bytes" ? fmtBytes(n.total) : fmt(n.total, unit) + " " + unit;
          const text = n.kind === "root" ? "all (" + all + ")" : label(n);
          t.textContent = text.length > room ? text.slice(0, Math.max(room - 1, 1)) + "\u2026" : text;
          g.appendChild(t);
        }
        svg.appendChild(g);
        let cx = x;
        for (const c of n.children) {
          const cw = n.total > 0 ? w * c.total / n.total : 0;
          place(c, cx, cw, d + 1);
          cx += cw;
        }
      }
      if (focus !== root) place(root, 0, W, 0);
      place(focus, 0, width, start);
      svg.dataset.rects = String(count);
    }
    draw();
    return root;
  }

  function legend() {
    const p = node("p", { class: "legend" });
    [["forward steps", BLUES[1]], ["backward steps", ORANGES[1]], ["regions (the loop's phases)", GREY]].forEach(function (l) {
      const s = node("span");
      const i = node("i");
      i.style.background = l[1];
      s.appendChild(i);
      s.appendChild(document.createTextNode(l[0]));
      p.appendChild(s);
    });
    return p;
  }

  function table(head, body, classes) {
    const t = node("table", { class: "rows" });
    const tr = node("tr");
    head.forEach(function (h, i) { tr.appendChild(node("th", i === 0 ? { class: "name" } : {}, h)); });
    t.appendChild(node("thead")).appendChild(tr);
    const tb = t.appendChild(node("tbody"));
    body.forEach(function (cells, k) {
      const row = node("tr", classes && classes[k] ? { class: classes[k] } : {});
      cells.forEach(function (c, i) {
        const td = node("td", i === 0 ? { class: "name" } : {});
        if (c instanceof Node) td.appendChild(c); else td.textContent = c;
        row.appendChild(td);
      });
      tb.appendChild(row);
    });
    return t;
  }
  function indent(r) { return "\u00a0\u00a0".repeat(Math.max(r.depth, 0)) + label(r); }

  /* The table as the text table has it: the columns and cells of the column spec
   * (instrumented_convs/report/columns.py), written by Python in the table's unit. */
  function rowsTable(run) {
    const scoped = run.rows.some(function (r) { return r.scope; });
    const head = ["step"].concat(scoped ? [run.relations ? "relation" : "layer"] : [], run.columns);
    const body = run.rows.map(function (r, k) {
      return [indent(r)].concat(scoped ? [r.scope || ""] : [], run.cells[k]);
    });
    const classes = run.rows.map(function (r) { return (r.phase === "backward" ? "backward " : "") + (r.kind === "region" ? "region" : ""); });
    return table(head, body, classes);
  }

  function ranksTable(ranks, unit) {
    const head = ["step"].concat(ranks.ranks.map(function (r) { return "rank " + r + " " + unit; }), ["slowest / fastest"]);
    const body = ranks.rows.map(function (r) {
      const most = Math.max.apply(null, r.totals.map(function (t) { return t || 0; }).concat([1e-30]));
      return [indent(r)].concat(r.totals.map(function (t) {
        const span = node("span");
        const bar = node("span", { class: "bar" });
        bar.style.width = Math.round(60 * (t || 0) / most) + "px";
        span.appendChild(bar);
        span.appendChild(document.createTextNode(t === null ? "-" : fmt(t, unit)));
        return span;
      }), [r.spread === null ? "" : r.spread.toFixed(2) + "x"]);
    });
    return table(head, body, ranks.rows.map(function (r) { return r.phase === "backward" ? "backward" : ""; }));
  }

  function loadersSection(loaders) {
    const box = node("div", { class: "loaders" });
    loaders.forEach(function (l) {
      const head = "Loader " + l.label + (l.rank === null ? "" : " (rank " + l.rank + ")") + ": " +
        l.consumed + " batches taken" + (l.made === null ? "" : ", " + l.made + " made by " + l.processes + " worker processes") +
        ", " + l.iteration_ms.toPrecision(3) + " ms an iteration";
      box.appendChild(node("p", { class: "loader" }, head));
      const split = box.appendChild(node("div", { class: "split" }));
      [["waiting for data", l.wait, "wait"], ["copy to the device", l.copy, "copy"], ["the rest (compute)", l.compute, "rest"]].forEach(function (p) {
        if (!(p[1] > 0)) return;
        const part = split.appendChild(node("span", { class: p[2], title: p[0] + " " + pct(p[1]) }, p[1] >= 0.08 ? p[0] + " " + pct(p[1]) : ""));
        part.style.width = (100 * p[1]).toFixed(2) + "%";
      });
      box.appendChild(node("p", { class: "verdict" }, l.verdict));
      l.busy.forEach(function (b, i) {
        const row = box.appendChild(node("div", { class: "worker" }));
        row.appendChild(node("span", { class: "who" }, "worker " + i + " busy"));
        const bar = row.appendChild(node("span", { class: "bar busy" }));
        bar.style.width = Math.round(240 * b) + "px";
        row.appendChild(node("span", {}, pct(b)));
      });
    });
    return box;
  }

  function diffTable(diff) {
    const u = diff.unit;
    const head = ["step", diff.labels[0] + " mean " + u, diff.labels[1] + " mean " + u, "change " + u, "change", "verdict"];
    const body = diff.rows.map(function (d) {
      const v = node("span", { class: d.verdict === "slower" || d.verdict === "faster" ? d.verdict : "" }, d.verdict);
      return [indent(d), fmt(d.a_mean, u), fmt(d.b_mean, u), fmt(d.change, u), pct(d.relative), v];
    });
    return table(head, body, diff.rows.map(function (d) { return d.phase === "backward" ? "backward" : ""; }));
  }

  function render() {
    const main = document.getElementById("main");
    main.appendChild(node("h1", {}, DATA.title));
    if (DATA.subtitle) main.appendChild(node("p", { class: "meta" }, DATA.subtitle));
    if (DATA.meta && DATA.meta.length) {
      const t = node("table", { class: "meta" });
      DATA.meta.forEach(function (kv) { const tr = t.appendChild(node("tr")); tr.appendChild(node("td", {}, kv[0])); tr.appendChild(node("td", {}, kv[1])); });
      main.appendChild(t);
    }
    main.appendChild(node("h2", {}, DATA.runs.length > 1 ? "Where the time goes, side by side (one scale)" : "Where the time goes"));
    main.appendChild(legend());
    const charts = main.appendChild(node("div", { class: "charts" }));
    const scale = Math.max.apply(null, DATA.runs.map(function (r) { return r.rows.filter(function (x) { return x.depth === 0 && x.kind !== "tool"; }).reduce(function (s, x) { return s + x.total; }, 0); }));
    DATA.runs.forEach(function (run) {
      const box = charts.appendChild(node("div", { class: "chart" }));
      if (DATA.runs.length > 1) box.appendChild(node("h3", {}, run.label));
      icicle(box, run.rows, run.unit, DATA.runs.length > 1 ? scale : 0);
    });
    main.appendChild(node("p", { class: "note" }, "Width: a step's total time; the gap under a step is its own code. Hover for numbers, click to zoom. " + (DATA.note || "")));
    if (DATA.advice) {
      main.appendChild(node("h2", {}, "What to change"));
      const box = main.appendChild(node("div", { class: "advice" }));
      if (!DATA.advice.length) box.appendChild(node("p", { class: "note" }, "Nothing worth 5% or more of the recorded time."));
      DATA.advice.forEach(function (a) {
        const where = a.layers.map(function (l) { return l.path + " (" + l["class"] + ")"; }).join(", ") + (a.ranks ? " on ranks " + a.ranks.join(", ") : "");
        const item = box.appendChild(node("div", { class: "item", "data-rule": a.rule }));
        var timed = a.measured_saving_share == null ? "" : ", " + (100 * a.measured_saving_share).toFixed(0) + "% saved as timed";
        item.appendChild(node("p", {}, (100 * a.at_stake_share).toFixed(0) + "% at stake (at most)" + timed + " in " + where + ": "));
        item.appendChild(node("code", {}, a.change));
        item.appendChild(node("p", { class: "note" }, "Why: " + a.why + ". Valid when " + a.valid_when + ". Outputs: " + a.outputs + "."));
      });
    }
    if (DATA.host_device) {
      main.appendChild(node("h2", {}, DATA.host_device[0].replace(/:$/, "")));
      const box = main.appendChild(node("div", { class: "hostdevice" }));
      DATA.host_device.slice(1).forEach(function (line) { box.appendChild(node("p", { class: "note" }, line.trim())); });
    }
    if (DATA.memory) {
      main.appendChild(node("h2", {}, "Where the memory goes: what each step keeps for backward"));
      const box = main.appendChild(node("div", { class: "chart memory" }));
      icicle(box, DATA.memory, "bytes", 0);
      main.appendChild(node("p", { class: "note" }, "Width: the bytes of the tensors a step made that autograd kept for backward, all its calls (its children's included; the gap under a step is its own); hover for what a call keeps, and its peak. The data, the parameters and what was made outside steps count nothing."));
    }
    if (DATA.diff) {
      main.appendChild(node("h2", {}, "Change per step (mean per call)"));
      main.appendChild(diffTable(DATA.diff));
    }
    if (DATA.loaders) {
      main.appendChild(node("h2", {}, "Data loaders: waiting for data against the rest"));
      main.appendChild(loadersSection(DATA.loaders));
    }
    if (DATA.ranks) {
      main.appendChild(node("h2", {}, "Per rank"));
      main.appendChild(ranksTable(DATA.ranks, DATA.runs[0].unit));
    }
    DATA.runs.forEach(function (run) {
      main.appendChild(node("h2", {}, "Table" + (DATA.runs.length > 1 ? ": " + run.label : "")));
      main.appendChild(rowsTable(run));
    });
    document.body.appendChild(tip);
  }

  render();
  document.body.dataset.ready = "1";
  showErrors();
})();
