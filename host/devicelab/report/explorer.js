/* devicelab explorer: draws the embedded records with plotly; every view follows the filters, which live in the
   page's address (#device=a,b&quant=…) so a reload or a shared link shows the same selection. */
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("dl-data").textContent);
  const F = ["device", "model", "backend", "quant", "run"];
  const CONFIG = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"]};
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"];
  const sel = {};

  function color(key) {
    let h = 0;
    for (const ch of key) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
    return PALETTE[h % PALETTE.length];
  }

  function readHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    for (const f of F) {
      const all = D.filters[f] || [];
      const asked = h.has(f) ? h.get(f).split(",").filter((v) => all.includes(v)) : [];
      // "quant=" keeps nothing; names this page does not know (another lab's link) keep everything
      sel[f] = new Set(asked.length || (h.has(f) && h.get(f) === "") ? asked : all);
    }
    document.querySelectorAll("#filters input").forEach((i) => { i.checked = sel[i.name].has(i.value); });
  }

  function writeHash() {
    const h = new URLSearchParams();
    for (const f of F) {
      if (sel[f].size !== (D.filters[f] || []).length) h.set(f, [...sel[f]].join(","));
    }
    const s = h.toString();
    history.replaceState(null, "", s ? "#" + s : location.pathname + location.search);
  }

  function keep(p) {
    for (const f of F) {
      if (f === "run" && Array.isArray(p.runs)) {
        if (p.runs.length && !p.runs.some((r) => sel.run.has(r))) return false;
        continue;
      }
      const v = p[f];
      if (v === undefined || v === null || v === "" || !(D.filters[f] || []).includes(v)) continue;
      if (!sel[f].has(v)) return false;
    }
    return true;
  }

  function groupBy(items, keyf) {
    const m = new Map();
    for (const it of items) {
      const k = keyf(it);
      if (!m.has(k)) m.set(k, []);
      m.get(k).push(it);
    }
    return m;
  }

  function draw(id, traces, layout, emptyText) {
    const div = document.getElementById("plot-" + id), empty = document.getElementById("empty-" + id);
    if (!traces.length) {
      Plotly.purge(div);
      div.hidden = true;
      empty.hidden = false;
      empty.textContent = emptyText;
      return;
    }
    div.hidden = false;
    empty.hidden = true;
    Plotly.react(div, traces, Object.assign({margin: {t: 30, r: 20, b: 50, l: 60}, hovermode: "closest",
      hoverlabel: {align: "left"}, legend: {font: {size: 10}}}, layout), CONFIG);
  }

  function line(pts, name, extra) {
    pts = pts.slice().sort((a, b) => a.x - b.x);
    return Object.assign({type: "scatter", mode: "lines+markers", name: name, x: pts.map((p) => p.x),
      y: pts.map((p) => p.y), hovertext: pts.map((p) => p.hover), hovertemplate: "%{hovertext}<extra></extra>",
      line: {color: color(name)}, marker: {color: color(name), size: 7}}, extra || {});
  }

  function frontier() {
    const pts = D.frontier.filter(keep);
    const devices = [...new Set(pts.map((p) => p.device))];
    const ROLE = {pick: ["star", 18, "#2a2"], frontier: ["diamond", 11, "#1f77b4"], passes: ["circle", 9, "#999"],
                  lost: ["x", 9, "#c33"]};
    const traces = [];
    const layout = {grid: {rows: 1, columns: Math.max(devices.length, 1), pattern: "independent"}, height: 420,
                    annotations: []};
    devices.forEach((dev, i) => {
      const ax = i ? String(i + 1) : "";
      for (const [role, [sym, size, col]] of Object.entries(ROLE)) {
        const g = pts.filter((p) => p.device === dev && p.role === role);
        if (!g.length) continue;
        traces.push({type: "scatter", mode: "markers+text", name: dev + ": " + role, x: g.map((p) => p.mib),
          y: g.map((p) => p.decode), text: g.map((p) => p.quant), textposition: "top center",
          hovertext: g.map((p) => p.hover), hovertemplate: "%{hovertext}<extra></extra>", xaxis: "x" + ax,
          yaxis: "y" + ax, marker: {symbol: sym, size: size, color: col}, legendgroup: role});
      }
      layout["xaxis" + ax] = {title: {text: dev + ": file MiB"}};
      layout["yaxis" + ax] = {title: {text: "decode t/s"}};
    });
    draw("frontier", traces, layout, "No candidate is left by the filters.");
  }

  function speed() {
    const pts = D.points.filter((p) => (p.metric === "prefill_tps" || p.metric === "decode_tps") && keep(p));
    const traces = [];
    for (const [k, g] of groupBy(pts, (p) => [p.metric, p.device, p.model, p.backend, p.threads].join("|"))) {
      const [metric, dev, model, be, thr] = k.split("|");
      traces.push(line(g, `${dev} · ${model} · ${be} · ${thr} thr`, {xaxis: metric === "decode_tps" ? "x2" : "x",
        yaxis: metric === "decode_tps" ? "y2" : "y", legendgroup: k.slice(k.indexOf("|") + 1),
        showlegend: metric === "decode_tps",
        error_y: {type: "data", array: g.slice().sort((a, b) => a.x - b.x).map((p) => p.sd || 0), visible: true}}));
    }
    draw("speed", traces, {grid: {rows: 1, columns: 2, pattern: "independent"}, height: 420,
      xaxis: {title: {text: "bits per weight (prefill)"}}, yaxis: {title: {text: "prefill t/s"}},
      xaxis2: {title: {text: "bits per weight (decode)"}}, yaxis2: {title: {text: "decode t/s"}}},
      "No speed was measured for this selection.");
  }

  function quality() {
    const pts = D.points.filter((p) => (p.metric === "kld_mean" || p.metric === "ppl_ratio") && keep(p));
    const traces = [];
    for (const [k, g] of groupBy(pts, (p) => [p.metric, p.device, p.model, p.backend].join("|"))) {
      const [metric, dev, model, be] = k.split("|");
      const two = metric === "ppl_ratio";
      traces.push(line(g, `${dev} · ${model} · ${be}`, {xaxis: two ? "x2" : "x", yaxis: two ? "y2" : "y",
        legendgroup: k.slice(k.indexOf("|") + 1), showlegend: !two}));
    }
    draw("quality", traces, {grid: {rows: 1, columns: 2, pattern: "independent"}, height: 400,
      xaxis: {title: {text: "bits per weight"}}, yaxis: {title: {text: "mean KLD vs base (nats)"}, type: "log"},
      xaxis2: {title: {text: "bits per weight"}}, yaxis2: {title: {text: "PPL(quant) / PPL(base)"}}},
      "No quality was measured for this selection (add a kld or eval payload).");
  }

  function energy() {
    const c = D.frontier.filter((p) => p.wh !== null && p.wh !== undefined && keep(p));
    const pts = D.points.filter((p) => p.metric === "energy_per_token" && keep(p));
    const traces = [];
    if (c.length) {
      traces.push({type: "bar", name: "mWh per prompt", x: c.map((p) => p.device + " " + p.model + " " + p.quant),
        y: c.map((p) => p.wh * 1000), hovertext: c.map((p) => p.hover), hovertemplate: "%{hovertext}<extra></extra>"});
    }
    for (const [k, g] of groupBy(pts, (p) => [p.device, p.model, p.backend, p.phase].join(" · "))) {
      traces.push(line(g, k + " J/tok", {xaxis: "x2", yaxis: "y2"}));
    }
    const why = D.notes.energy ? ": " + D.notes.energy : "";
    draw("energy", traces, {grid: {rows: 1, columns: 2, pattern: "independent"}, height: 380,
      yaxis: {title: {text: "mWh per prompt"}}, xaxis2: {title: {text: "bits per weight"}},
      yaxis2: {title: {text: "J per token"}}}, "No energy was measured for this selection" + why + ".");
  }

  function roofline() {
    const pts = D.roofline.filter(keep);
    const traces = [];
    for (const [k, g] of groupBy(pts, (p) => [p.device, p.model, p.metric, p.threads].join(" · "))) {
      const s = g.slice().sort((a, b) => a.x - b.x);
      traces.push({type: "scatter", mode: "markers", name: k, x: s.map((p) => p.x), y: s.map((p) => p.tps),
        hovertext: s.map((p) => p.hover), hovertemplate: "%{hovertext}<extra></extra>", marker: {color: color(k)}});
      traces.push({type: "scatter", mode: "lines", name: k + " limit", x: s.map((p) => p.x),
        y: s.map((p) => p.limit), line: {dash: "dash", color: color(k)}, hoverinfo: "skip"});
    }
    draw("roofline", traces, {height: 380, xaxis: {title: {text: "bits per weight"}},
      yaxis: {title: {text: "t/s"}, type: "log"}},
      "No bandwidth measurement for this selection: add a `kind: membw` payload.");
  }

  function sustained() {
    const runs = D.sustained.filter(keep);
    const out = [];
    for (const r of runs) {
      const c = color(r.label);
      const stab = r.stability == null ? "" : ` · stability ${r.stability.toFixed(2)}`;
      const thr = r.throttle_s == null ? " · no throttle" : ` · throttled at ${r.throttle_s.toFixed(0)} s`;
      out.push({type: "scatter", mode: "lines+markers", name: r.label + stab + thr, x: r.t, y: r.tps,
        line: {color: c}, marker: {color: c, size: 5}, hovertext: r.t.map(() => r.hover),
        hovertemplate: "%{y:.1f} t/s at %{x:.0f} s<br>%{hovertext}<extra></extra>"});
      if (r.temp.length) out.push({type: "scatter", mode: "lines", name: r.label + " °C", x: r.temp_t, y: r.temp,
        yaxis: "y2", line: {color: c, dash: "dot"}, hovertemplate: "hottest zone %{y:.1f} °C at %{x:.0f} s<extra></extra>"});
    }
    const noTemp = runs.filter((r) => !r.temp.length).map((r) => r.label + ": " + (r.temp_missing || "no temperature"));
    draw("sustained", out, {height: 380, xaxis: {title: {text: "seconds from the start of the run"}},
      yaxis: {title: {text: "decode t/s"}, rangemode: "tozero"},
      yaxis2: {title: {text: "hottest zone °C"}, overlaying: "y", side: "right", showgrid: false, tickformat: ".1f"},
      annotations: noTemp.length ? [{xref: "paper", yref: "paper", x: 0, y: 1.08, showarrow: false, xanchor: "left",
        font: {size: 11, color: "#666"}, text: noTemp.join("; ")}] : []},
      "No sustained run for this selection: add a `kind: soak` payload (duration_s: 600 on a phone).");
  }

  const PHASE = {prefill: "rgba(31,119,180,0.18)", pg: "rgba(31,119,180,0.18)", decode: "rgba(255,127,14,0.22)"};

  function traces() {
    const cells = D.traces.filter(keep);
    const devices = [...new Set(cells.map((c) => c.device))];
    const out = [], shapes = [], layout = {height: 260 * Math.max(devices.length, 1) + 60, showlegend: true,
      xaxis: {type: "date", title: {text: "time (UTC)"}}, annotations: []};
    const n = devices.length, gap = 0.06;
    devices.forEach((dev, i) => {
      const y = "y" + (2 * i + 1 === 1 ? "" : 2 * i + 1), y2 = "y" + (2 * i + 2);
      const top = 1 - i / n, bottom = 1 - (i + 1) / n + (i + 1 < n ? gap : 0);
      layout["yaxis" + (2 * i + 1 === 1 ? "" : 2 * i + 1)] = {domain: [bottom, top], title: {text: dev + ": RSS MiB"}};
      layout["yaxis" + (2 * i + 2)] = {overlaying: y, side: "right", title: {text: "°C · GHz"}, showgrid: false};
      for (const c of cells.filter((c) => c.device === dev)) {
        const ms = (t) => new Date(t * 1000).toISOString();
        const s = c.series;
        const name = c.label;
        if (s.rss_mib) out.push({type: "scatter", mode: "lines", name: name, legendgroup: "rss", showlegend: false,
          x: s.rss_mib.t.map(ms), y: s.rss_mib.y, yaxis: y, line: {color: color(c.quant), width: 1.5},
          hovertemplate: name + "<br>RSS %{y:.0f} MiB<extra></extra>"});
        if (s.temp_c) out.push({type: "scatter", mode: "lines", name: name + " °C", showlegend: false,
          x: s.temp_c.t.map(ms), y: s.temp_c.y, yaxis: y2, line: {color: "#d62728", width: 1},
          hovertemplate: name + "<br>hottest zone %{y:.1f} °C<extra></extra>"});
        if (s.cpu_ghz) out.push({type: "scatter", mode: "lines", name: name + " GHz", showlegend: false,
          x: s.cpu_ghz.t.map(ms), y: s.cpu_ghz.y, yaxis: y2, line: {color: "#2ca02c", width: 1},
          hovertemplate: name + "<br>CPU %{y:.2f} GHz<extra></extra>"});
        out.push({type: "scatter", mode: "markers", name: name, showlegend: false, x: [ms((c.start + c.end) / 2)],
          y: [s.rss_mib ? Math.max(...s.rss_mib.y) : 0], yaxis: y, hovertext: [c.hover],
          hovertemplate: "%{hovertext}<extra></extra>",
          marker: {symbol: c.throttled ? "triangle-down" : "circle-open", size: c.throttled ? 12 : 7,
                   color: c.throttled ? "#c00" : "#555"}});
        for (const p of c.phases) {
          shapes.push({type: "rect", xref: "x", yref: y + " domain", x0: ms(p.start), x1: ms(p.end), y0: 0, y1: 1,
            fillcolor: PHASE[p.kind] || "rgba(0,0,0,0.05)", line: {width: 0}, layer: "below"});
        }
        if (c.throttled) shapes.push({type: "rect", xref: "x", yref: y + " domain", x0: ms(c.start), x1: ms(c.end),
          y0: 0.95, y1: 1, fillcolor: "rgba(200,0,0,0.6)", line: {width: 0}});
      }
      if (!cells.some((c) => c.device === dev && c.series.temp_c)) {
        layout.annotations.push({xref: "paper", yref: y + " domain", x: 0, y: 1.02, showarrow: false,
          xanchor: "left", font: {size: 11, color: "#666"},
          text: dev + ": " + (D.notes.temperature || "no temperature readable") + "; throttling unknown"});
      }
    });
    layout.shapes = shapes;
    for (const [kind, col] of [["prefill", PHASE.prefill], ["decode", PHASE.decode]]) {
      out.push({type: "scatter", mode: "markers", x: [null], y: [null], name: kind + " phase",
        marker: {symbol: "square", size: 12, color: col}});
    }
    draw("traces", cells.length ? out : [], layout, "No telemetry traces for this selection (a report from an " +
      "exported table has none).");
  }

  const TABLE_FIELDS = ["device", "model", "quant", "backend"];

  function tables() {
    document.querySelectorAll("main table").forEach((t) => {
      const heads = [...t.querySelectorAll("thead th")].map((th) => th.textContent.trim());
      const holder = t.closest("[data-device]");
      t.querySelectorAll("tbody tr").forEach((tr) => {
        const cells = tr.children, p = {};
        for (const f of TABLE_FIELDS) {
          const i = heads.indexOf(f);
          if (i >= 0 && cells[i]) p[f] = cells[i].textContent.trim();
        }
        if (holder && p.device === undefined) p.device = holder.dataset.device;
        if (keep(p)) tr.removeAttribute("data-hidden"); else tr.setAttribute("data-hidden", "");
      });
    });
    document.querySelectorAll(".rec[data-device], li[data-device]").forEach((el) => {
      const p = {device: el.dataset.device, model: el.dataset.model};
      if (keep(p)) el.removeAttribute("data-hidden"); else el.setAttribute("data-hidden", "");
    });
  }

  function render() {
    for (const f of [frontier, speed, quality, energy, roofline, sustained, traces]) f();
    tables();
  }

  document.getElementById("filters").addEventListener("change", (e) => {
    const i = e.target;
    if (i.checked) sel[i.name].add(i.value); else sel[i.name].delete(i.value);
    writeHash();
    render();
  });
  window.addEventListener("hashchange", () => { readHash(); render(); });
  readHash();
  render();
  window.devicelabExplorer = {selection: sel, render: render};
})();
