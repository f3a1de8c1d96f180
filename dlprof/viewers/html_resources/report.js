/* dlprof HTML report: builds the page from the JSON in #report-data.
 *
 * Every name from the run is set with textContent or drawn on a canvas, never parsed as HTML.
 * No library: charts are SVG, the timeline a canvas. The page makes no request.
 */
(function () {
  "use strict";

  var data = JSON.parse(document.getElementById("report-data").textContent);
  var SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function setAttrs(node, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (key) { node.setAttribute(key, String(attrs[key])); });
  }

  function section(id, title) {
    var box = el("section", { id: id, "data-testid": id });
    box.appendChild(el("h2", null, title));
    document.getElementById("report").appendChild(box);
    return box;
  }

  function note(parent, text, testid) {
    parent.appendChild(el("p", { "class": "note", "data-testid": testid || "note" }, text));
  }

  var TIME_UNITS = [[1e9, "s"], [1e6, "ms"], [1e3, "us"], [1, "ns"]];

  function fmtTime(ns) {
    var abs = Math.abs(ns);
    for (var i = 0; i < TIME_UNITS.length; i++) {
      if (abs >= TIME_UNITS[i][0]) return (ns / TIME_UNITS[i][0]).toPrecision(4).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "") + " " + TIME_UNITS[i][1];
    }
    return "0";
  }

  function fmtValue(value, unit) {
    if (unit === "bytes") {
      var units = ["B", "KiB", "MiB", "GiB", "TiB"];
      var i = 0;
      while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i++; }
      return value.toPrecision(4).replace(/\.?0+$/, "") + " " + units[i];
    }
    var text = Math.abs(value) >= 1e6 ? value.toExponential(3) : String(Math.round(value * 1000) / 1000);
    return unit ? text + " " + unit : text;
  }

  function hue(text) {
    var h = 0;
    for (var i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) >>> 0;
    return h % 360;
  }


  /* ---- what the page opens with: the GPUs and the advice ---- */

  function renderGpu() {
    var gpu = data.gpu, box = section("gpu", "GPU");
    if (gpu.reason) { note(box, gpu.reason, "gpu-reason"); return; }
    var devices = gpu.devices;
    devices.rows.forEach(function (d) {
      var at = function (key) { return d[devices.columns.indexOf(key)]; };
      note(box, at("device") + (data.summary.ranks.length > 1 ? " (rank " + at("rank") + ")" : "") + " busy " +
        at("busy_pct").toFixed(1) + "% over " + at("window") + " (" + fmtTime(at("span_ns")) + "): kernels " +
        fmtTime(at("kernel_ns")) + ", copies and memsets " + fmtTime(at("copy_ns")) + ", idle " + fmtTime(at("idle_ns")),
        "gpu-busy");
    });
    box.appendChild(el("h3", null, "Utilisation per step"));
    utilisationChart(box, gpu.steps);
    box.appendChild(el("h3", null, "Kernels by GPU time"));
    table(box, gpu.kernels, "table-gpu-kernels");
  }

  // One bar per GPU and step, the step's span as 100%: kernels, copies and memsets, idle.
  function utilisationChart(parent, steps) {
    var width = 1000, height = 220, pad = { l: 50, r: 10, t: 10, b: 36 };
    var col = function (key) { return steps.columns.indexOf(key); };
    var chart = svgEl("svg", { viewBox: "0 0 " + width + " " + height, "class": "chart", "data-testid": "gpu-chart" });
    axes(chart, width, height, pad, "step (" + steps.rows.length + "; grey: warm-up or partial)", 100,
      function (v) { return v.toFixed(0) + "%"; });
    var step = (width - pad.l - pad.r) / Math.max(steps.rows.length, 1), inner = height - pad.t - pad.b;
    steps.rows.forEach(function (r, i) {
      var span = r[col("span_ns")] || 1, y = height - pad.b;
      [["kernel_ns", "kernel"], ["copy_ns", "copy"], ["idle_ns", "idle"]].forEach(function (part) {
        var h = inner * Math.max(r[col(part[0])], 0) / span;
        h = Math.min(h, y - pad.t);
        var bar = svgEl("rect", { x: pad.l + i * step, y: y - h, width: Math.max(step * 0.85, 0.5), height: h,
          "class": "gpu " + part[1] + (r[col("status")] === "counted" ? "" : " uncounted"), "data-testid": "gpu-" + part[1] });
        bar.appendChild(svgEl("title", null, r[col("step")] + " on " + r[col("device")] + ": " + part[1] + " " +
          fmtTime(r[col(part[0])]) + " of " + fmtTime(span) + (r[col("status")] === "counted" ? "" : " (" + r[col("status")] + ")")));
        chart.appendChild(bar);
        y -= h;
      });
    });
    parent.appendChild(chart);
    note(parent, "Blue: kernels; orange: copies and memsets; light: idle. Busy " +
      steps.rows.filter(function (r) { return r[col("status")] === "counted"; }).map(function (r) {
        return r[col("busy_pct")]; }).reduce(function (lo, v) { return [Math.min(lo[0], v), Math.max(lo[1], v)]; },
        [Infinity, -Infinity]).map(function (v) { return isFinite(v) ? v.toFixed(0) + "%" : "-"; }).join(" to ") +
      " of each counted step.", "gpu-chart-note");
  }

  function renderAdvice() {
    var advice = data.advice, box = section("advice", "Advice");
    if (advice.reason) note(box, advice.reason, "advice-reason");
    if (!advice.findings.length) return;
    note(box, "The top " + advice.findings.length + " of " + advice.total + " findings, most time at stake first " +
      "(dlprof advise shows every one with its threshold and source).", "advice-note");
    var list = el("ol", { "class": "findings", "data-testid": "advice-findings" });
    advice.findings.forEach(function (f) {
      var item = el("li", { "data-rule": f.rule });
      var head = el("p", { "class": "finding" });
      head.appendChild(el("strong", null, f.title));
      head.appendChild(document.createTextNode(" (" + f.rule + ", " + f.severity + "): " + fmtTime(f.stake_ns) + " at stake" +
        (f.shared_ns > 0 ? " (" + fmtTime(f.shared_ns) + " of the time it claims counted under " + f.shared_with.join(", ") + ")" : "")));
      item.appendChild(head);
      item.appendChild(el("p", { "class": "note" }, f.summary));
      var places = el("ul");
      f.evidence.forEach(function (e) { places.appendChild(el("li", null, e.place + ": " + e.detail)); });
      item.appendChild(places);
      item.appendChild(el("p", { "class": "fix" }, "Fix: " + f.fix));
      list.appendChild(item);
    });
    box.appendChild(list);
  }

  /* ---- summary ---- */

  function renderSummary() {
    var s = data.summary;
    var box = section("summary", "Run " + s.name);
    var list = el("dl", { "class": "summary" });
    function row(term, value, testid) {
      list.appendChild(el("dt", null, term));
      list.appendChild(el("dd", { "data-testid": "summary-" + testid }, value));
    }
    row("Command", s.command.join(" "), "command");
    row("Status", s.status + (s.exit_code !== null ? " (exit code " + s.exit_code + ")" : ""), "status");
    if (s.degraded && s.degraded.length) {
      list.appendChild(el("dt", null, "Not recorded"));
      list.appendChild(el("dd", { "data-testid": "summary-degraded", "class": "warn" }, s.degraded.join("; ")));
    }
    if (s.error) row("Error", s.error, "error");
    row("Host", [s.host.hostname, s.host.os, s.host.cpu_model, s.host.cpu_cores + " cores",
      fmtValue(s.host.memory_bytes, "bytes"), "Python " + s.host.python].filter(Boolean).join(" · "), "host");
    row("Devices", s.devices.length ? s.devices.map(function (d) {
      return [d.name, d.computeMajor !== undefined ? "sm " + d.computeMajor + "." + d.computeMinor : "",
        d.totalGlobalMem ? fmtValue(d.totalGlobalMem, "bytes") : ""].filter(Boolean).join(" ");
    }).join("; ") : "none recorded (CPU only)", "devices");
    row("Started", s.start_ns ? new Date(s.start_ns / 1e6).toISOString() : "unknown", "start");
    row("Duration", s.duration_ns ? fmtTime(s.duration_ns) : "unknown", "duration");
    row("Ranks", s.ranks.join(", ") + " of world size " + s.world_size, "ranks");
    if (s.schedule) row("Schedule", s.schedule, "schedule");
    row("Slices", Object.keys(s.kinds).map(function (k) { return s.kinds[k] + " " + k; }).join(", ") || "none", "kinds");
    box.appendChild(list);
    var collectors = el("ul", { "data-testid": "collectors" });
    s.collectors.forEach(function (c) {
      var item = el("li", null, c.name + (c.version ? " " + c.version : "") + (c.active ? "" : " (inactive)"));
      if (c.notes.length) {
        var notes = el("ul");
        c.notes.forEach(function (n) { notes.appendChild(el("li", { "class": "warn" }, n)); });
        item.appendChild(notes);
      }
      collectors.appendChild(item);
    });
    box.appendChild(el("h3", null, "Collectors"));
    box.appendChild(s.collectors.length ? collectors : el("p", { "class": "note" }, "none recorded"));
  }

  /* ---- charts ---- */

  function axes(chart, width, height, pad, xLabel, yMax, yFmt) {
    chart.appendChild(svgEl("line", { x1: pad.l, y1: height - pad.b, x2: width - pad.r, y2: height - pad.b, "class": "axis" }));
    chart.appendChild(svgEl("line", { x1: pad.l, y1: pad.t, x2: pad.l, y2: height - pad.b, "class": "axis" }));
    for (var i = 0; i <= 4; i++) {
      var y = height - pad.b - (height - pad.t - pad.b) * i / 4;
      chart.appendChild(svgEl("line", { x1: pad.l, y1: y, x2: width - pad.r, y2: y, "class": "grid" }));
      chart.appendChild(svgEl("text", { x: pad.l - 4, y: y + 4, "text-anchor": "end" }, yFmt(yMax * i / 4)));
    }
    chart.appendChild(svgEl("text", { x: (width + pad.l) / 2, y: height - 4, "text-anchor": "middle" }, xLabel));
  }

  function renderSteps() {
    var box = section("steps", "Step times");
    var rows = data.steps.rows;
    if (!rows.length) { note(box, data.steps.reason); return; }
    var width = 1000, height = 260, pad = { l: 70, r: 10, t: 10, b: 36 };
    // The axis fits the counted steps, up to three times their median: a warm-up step (model
    // set-up, the first CUDA calls) or one stalled step many times longer would flatten the
    // others; a bar past the axis is cut and its time written above it.
    var countedDurs = rows.filter(function (r) { return r[4] === "counted"; }).map(function (r) { return r[3]; });
    var all = rows.map(function (r) { return r[3]; });
    var sorted = countedDurs.slice().sort(function (a, b) { return a - b; });
    var median = sorted.length ? sorted[Math.floor(sorted.length / 2)] : 0;
    var max = (sorted.length ? Math.min(sorted[sorted.length - 1], 3 * median) * 1.15 : Math.max.apply(null, all)) || 1;
    var chart = svgEl("svg", { viewBox: "0 0 " + width + " " + height, "class": "chart", "data-testid": "step-chart",
      "data-axis-max": max });
    axes(chart, width, height, pad, "step (" + rows.length + ", in order of start)", max, fmtTime);
    var step = (width - pad.l - pad.r) / rows.length;
    rows.forEach(function (r, i) {
      var h = (height - pad.t - pad.b) * Math.min(r[3], max) / max;
      if (r[3] > max) {
        chart.appendChild(svgEl("text", { x: pad.l + i * step + step * 0.42, y: pad.t + 10, "text-anchor": "middle",
          "class": "cut", "data-testid": "step-cut" }, "\u25B2 " + fmtTime(r[3])));
      }
      var bar = svgEl("rect", { x: pad.l + i * step, y: height - pad.b - h, width: Math.max(step * 0.85, 0.5), height: h,
        "class": "bar rank" + (r[0] % 4) + (r[4] === "counted" ? "" : " uncounted") + (r[3] > max ? " cut" : "") });
      bar.appendChild(svgEl("title", null, r[1] + (data.summary.ranks.length > 1 ? " (rank " + r[0] + ")" : "") + ": " + fmtTime(r[3]) +
        (r[4] === "counted" ? "" : " (" + r[4] + ")")));
      chart.appendChild(bar);
    });
    box.appendChild(chart);
    // The warm-up and the partial step (open when profiling stopped) are drawn but not counted.
    var counted = rows.filter(function (r) { return r[4] === "counted"; });
    var durs = counted.map(function (r) { return r[3]; }).sort(function (a, b) { return a - b; });
    var left = rows.length - counted.length;
    note(box, counted.length + " steps counted" + (left ? " (" + left + " left out: warm-up, partial)" : "") +
      (durs.length ? "; median " + fmtTime(durs[Math.floor(durs.length / 2)]) + ", slowest " + fmtTime(durs[durs.length - 1]) : ""),
      "steps-note");
    box.appendChild(el("h3", null, "Statistics of the counted steps"));
    table(box, data.steps.statistics, "table-step-statistics");
    box.appendChild(el("h3", null, "Mean time per counted step, by part"));
    table(box, data.steps.breakdown, "table-step-breakdown");
    if (data.steps.device_breakdown.rows.length) {
      box.appendChild(el("h3", null, "Mean GPU time per counted step, by the part that launched it, and idle"));
      table(box, data.steps.device_breakdown, "table-step-device-breakdown");
    }
    var energy = data.steps.energy;
    if (!energy.recorded) { note(box, energy.reason, "steps-energy"); return; }
    box.appendChild(el("h3", null, "Energy per counted step"));
    table(box, energy, "table-step-energy");
    note(box, "Total over the run's " + energy.steps + " steps: " + energy.total_joules.toPrecision(4) + " J" +
      " (power integrated over each step's window; mean joules and watts over the counted steps)", "steps-energy");
  }

  function lineChart(parent, series, testid) {
    var width = 1000, height = 200, pad = { l: 80, r: 10, t: 10, b: 36 };
    var box = el("figure", { "class": "curve" });
    box.appendChild(el("figcaption", null, series.label + (series.peak !== undefined ? " — peak " + fmtValue(series.peak, series.unit) : "")));
    var chart = svgEl("svg", { viewBox: "0 0 " + width + " " + height, "class": "chart", "data-testid": testid });
    var ts = series.ts, values = series.values;
    var tMin = ts.length ? ts[0] : 0, tMax = ts.length ? ts[ts.length - 1] : 1;
    var yMax = Math.max.apply(null, values.concat([0])) || 1;
    axes(chart, width, height, pad, "time since the first event (" + fmtTime(tMax - tMin || 0) + " shown)", yMax,
      function (v) { return fmtValue(v, series.unit); });
    var points = ts.map(function (t, i) {
      var x = pad.l + (width - pad.l - pad.r) * (tMax > tMin ? (t - tMin) / (tMax - tMin) : 0);
      var y = height - pad.b - (height - pad.t - pad.b) * values[i] / yMax;
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    chart.appendChild(svgEl("polyline", { points: points.join(" "), "class": "line" }));
    if (series.peak_ts !== undefined && series.peak_ts !== null && series.peak !== undefined) {
      // The peak as recorded, not as binned: a bin's first time stands for all of it.
      var px = pad.l + (width - pad.l - pad.r) * (tMax > tMin ? Math.min(Math.max((series.peak_ts - tMin) / (tMax - tMin), 0), 1) : 0);
      var py = height - pad.b - (height - pad.t - pad.b) * series.peak / yMax;
      chart.appendChild(svgEl("line", { x1: px, y1: pad.t, x2: px, y2: height - pad.b, "class": "peak-line" }));
      var dot = svgEl("circle", { cx: px, cy: py, r: 4, "class": "peak", "data-testid": testid + "-peak" });
      dot.appendChild(svgEl("title", null, "peak " + fmtValue(series.peak, series.unit) + " at " + fmtTime(series.peak_ts)));
      chart.appendChild(dot);
    }
    box.appendChild(chart);
    parent.appendChild(box);
  }

  function renderMemory() {
    renderCurves("memory", "Memory", data.memory);
    var box = document.getElementById("memory");
    if (!data.memory.peaks || !data.memory.peaks.rows.length) return;
    box.appendChild(el("h3", null, "Peak per device"));
    note(box, "Live: recorded allocations not yet freed at the peak (matched by address); untraced: the rest, " +
      "allocated before recording began.", "memory-note");
    table(box, data.memory.peaks, "table-memory-peaks");
    box.appendChild(el("h3", null, "Live at the peak, by op"));
    table(box, data.memory.live, "table-memory-live");
  }

  function renderCurves(id, title, part) {
    var box = section(id, title);
    if (!part.series.length) { note(box, part.reason); return; }
    part.series.forEach(function (s, i) { lineChart(box, s, id + "-chart-" + i); });
  }

  /* ---- tables ---- */

  function table(parent, spec, testid) {
    var wrap = el("div", { "class": "table-wrap" });
    var t = el("table", { "data-testid": testid });
    var head = el("tr");
    var body = el("tbody");
    spec.columns.forEach(function (col, index) {
      var th = el("th", { "class": col.numeric ? "num" : "", scope: "col", "data-key": col.key, tabindex: 0 }, col.header);
      th.addEventListener("click", function () { sortBy(t, body, spec, index, th); });
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sortBy(t, body, spec, index, th); });
      head.appendChild(th);
    });
    var thead = el("thead");
    thead.appendChild(head);
    t.appendChild(thead);
    spec.rows.forEach(function (row, r) {
      var tr = el("tr", { "data-row": r });
      row.text.forEach(function (text, c) {
        tr.appendChild(el("td", { "class": spec.columns[c].numeric ? "num" : "", "data-key": spec.columns[c].key }, text));
      });
      tr.dlprofSort = row.sort;
      body.appendChild(tr);
    });
    t.appendChild(body);
    wrap.appendChild(t);
    parent.appendChild(wrap);
  }

  function sortBy(t, body, spec, index, th) {
    var descending = th.getAttribute("aria-sort") !== "descending";
    var numeric = spec.columns[index].numeric;
    Array.prototype.forEach.call(t.querySelectorAll("th"), function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    var rows = Array.prototype.slice.call(body.children);
    rows.sort(function (a, b) {
      var x = a.dlprofSort[index], y = b.dlprofSort[index], order;
      if (numeric) order = (x === null ? -Infinity : x) - (y === null ? -Infinity : y);
      else order = String(x).localeCompare(String(y));
      if (order === 0) order = Number(a.getAttribute("data-row")) - Number(b.getAttribute("data-row"));
      return descending ? -order : order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }

  function renderTables() {
    var box = section("tables", "Top tables");
    var kinds = Object.keys(data.tables);
    if (!kinds.length) { note(box, "the run holds no ops, layers, kernels or regions"); return; }
    kinds.forEach(function (kind) {
      var spec = data.tables[kind];
      box.appendChild(el("h3", null, spec.title));
      note(box, "Top " + spec.rows.length + " of " + spec.groups + " names (" + spec.total + " slices of kind " + kind +
        ") by " + spec.by + " time; click a header to sort.", "table-note-" + kind);
      table(box, spec, "table-" + kind);
    });
  }

  function renderTableSection(id, title, spec) {
    var box = section(id, title);
    if (spec.reason) note(box, spec.reason, id + "-reason");
    if (spec.intro) note(box, spec.intro, id + "-intro");
    if (spec.rows.length) table(box, spec, "table-" + id);
  }

  /* ---- timeline ---- */

  function renderTimeline() {
    var tl = data.timeline;
    var box = section("timeline", "Timeline");
    if (!tl.tracks.length) { note(box, "the run holds no slices"); return; }
    note(box, tl.shown < tl.total
      ? "Showing every step and the longest slices of each track: " + tl.shown + " of " + tl.total + " slices. Wheel or buttons to zoom, drag to pan."
      : "All " + tl.total + " slices. Wheel or buttons to zoom, drag to pan.", "timeline-note");
    var bar = el("div", { "class": "buttons" });
    var canvas = el("canvas", { "data-testid": "timeline-canvas", "data-shown": tl.shown, "data-total": tl.total });
    var tip = el("div", { "class": "tip", "data-testid": "timeline-tip" });
    var LANE = 16, HEAD = 18, LABEL = 170;
    var top = [], y = 0;
    tl.tracks.forEach(function (t) { top.push(y); y += HEAD + t.depth * LANE + 6; });
    var height = y;
    var end = 0;
    for (var i = 0; i < tl.start.length; i++) end = Math.max(end, tl.start[i] + tl.dur[i]);
    var view = { from: 0, to: end || 1 };
    function zoom(factor, at) {
      var span = view.to - view.from, pivot = view.from + span * at;
      var next = Math.min(Math.max(span * factor, 1000), (end || 1) * 1.05);
      view.from = Math.max(pivot - next * at, -end * 0.05);
      view.to = view.from + next;
      draw();
    }
    [["Zoom in", function () { zoom(0.5, 0.5); }], ["Zoom out", function () { zoom(2, 0.5); }],
      ["Reset", function () { view.from = 0; view.to = end || 1; draw(); }]].forEach(function (b) {
      var button = el("button", { type: "button", "data-testid": "timeline-" + b[0].toLowerCase().replace(" ", "-") }, b[0]);
      button.addEventListener("click", b[1]);
      bar.appendChild(button);
    });
    var range = el("span", { "class": "note", "data-testid": "timeline-range" });
    bar.appendChild(range);
    box.appendChild(bar);
    var frame = el("div", { "class": "timeline" });
    frame.appendChild(canvas);
    frame.appendChild(tip);
    box.appendChild(frame);

    function draw() {
      var ratio = window.devicePixelRatio || 1;
      var width = frame.clientWidth || 1000;
      canvas.width = width * ratio; canvas.height = height * ratio;
      canvas.style.width = width + "px"; canvas.style.height = height + "px";
      var g = canvas.getContext("2d");
      g.setTransform(ratio, 0, 0, ratio, 0, 0);
      g.clearRect(0, 0, width, height);
      g.font = "11px sans-serif";
      g.textBaseline = "middle";
      var scale = (width - LABEL) / (view.to - view.from);
      tl.tracks.forEach(function (t, k) {
        g.fillStyle = k % 2 ? "#f6f7f9" : "#ffffff";
        g.fillRect(0, top[k], width, HEAD + t.depth * LANE + 6);
        g.fillStyle = "#333";
        g.fillText(t.label, 4, top[k] + HEAD / 2);
      });
      for (var i = 0; i < tl.start.length; i++) {
        var x0 = LABEL + (tl.start[i] - view.from) * scale, x1 = x0 + tl.dur[i] * scale;
        if (x1 < LABEL || x0 > width) continue;
        x0 = Math.max(x0, LABEL); x1 = Math.min(x1, width);
        var yy = top[tl.track[i]] + HEAD + tl.depth[i] * LANE, name = tl.names[tl.name[i]];
        g.fillStyle = "hsl(" + hue(name) + ",55%,72%)";
        g.fillRect(x0, yy, Math.max(x1 - x0, 0.5), LANE - 2);
        if (x1 - x0 > 40) {
          g.save(); g.beginPath(); g.rect(x0, yy, x1 - x0, LANE - 2); g.clip();
          g.fillStyle = "#111"; g.fillText(name, x0 + 2, yy + LANE / 2 - 1); g.restore();
        }
      }
      range.textContent = fmtTime(view.from) + " – " + fmtTime(view.to) + " (" + fmtTime(view.to - view.from) + " shown)";
    }

    function hit(event) {
      var rect = canvas.getBoundingClientRect(), x = event.clientX - rect.left, yy = event.clientY - rect.top;
      if (x < LABEL) return -1;
      var t = view.from + (x - LABEL) * (view.to - view.from) / (rect.width - LABEL), best = -1;
      for (var i = 0; i < tl.start.length; i++) {
        var y0 = top[tl.track[i]] + HEAD + tl.depth[i] * LANE;
        if (yy >= y0 && yy < y0 + LANE && t >= tl.start[i] && t <= tl.start[i] + tl.dur[i]) best = i;
      }
      return best;
    }

    var drag = null;
    canvas.addEventListener("wheel", function (event) {
      event.preventDefault();
      var rect = canvas.getBoundingClientRect();
      var at = Math.min(Math.max((event.clientX - rect.left - LABEL) / (rect.width - LABEL), 0), 1);
      zoom(event.deltaY > 0 ? 1.25 : 0.8, at);
    }, { passive: false });
    canvas.addEventListener("mousedown", function (event) { drag = { x: event.clientX, from: view.from, to: view.to }; });
    window.addEventListener("mouseup", function () { drag = null; });
    canvas.addEventListener("mousemove", function (event) {
      if (drag) {
        var shift = (drag.x - event.clientX) * (drag.to - drag.from) / (canvas.clientWidth - LABEL);
        view.from = drag.from + shift; view.to = drag.to + shift;
        draw();
        return;
      }
      var i = hit(event);
      if (i < 0) { tip.style.display = "none"; return; }
      tip.textContent = tl.names[tl.name[i]] + " (" + tl.kinds[tl.kind[i]] + ") " + fmtTime(tl.dur[i]) + " at " + fmtTime(tl.start[i]);
      tip.style.display = "block";
      tip.style.left = (event.offsetX + 12) + "px";
      tip.style.top = (event.offsetY + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    window.addEventListener("resize", draw);
    draw();
  }


  // The roofline: log-log, FLOPs per byte against FLOP/s; one roof per math mode present
  // (min(peak, bandwidth x intensity)), one dot per op, its area by time.
  function renderRoofline() {
    var rf = data.roofline, box = section("roofline", "Roofline");
    if (!rf || !rf.points.length) { note(box, (rf && rf.reason) || "no roofline for this run", "roofline-reason"); return; }
    note(box, rf.device + ": " + (100 * rf.coverage).toFixed(1) + "% of device time has known FLOPs; " +
         "dots are ops (area: time), lines the roof of each math mode.", "roofline-note");
    var W = 640, H = 360, L = 60, B = 40, peaks = Object.keys(rf.peaks).map(function (k) { return rf.peaks[k]; });
    var xs = rf.points.map(function (p) { return p.intensity; }), ys = rf.points.map(function (p) { return p.flop_rate; });
    var ridge = Math.max.apply(null, peaks.map(function (p) { return p / rf.bandwidth; }).concat([1]));
    var x0 = Math.floor(Math.log10(Math.min.apply(null, xs.concat([ridge / 100])))),
        x1 = Math.ceil(Math.log10(Math.max.apply(null, xs.concat([ridge * 10]))));
    var y0 = Math.floor(Math.log10(Math.min.apply(null, ys))),
        y1 = Math.ceil(Math.log10(Math.max.apply(null, ys.concat(peaks))));
    function px(v) { return L + (Math.log10(v) - x0) / (x1 - x0) * (W - L - 10); }
    function py(v) { return H - B - (Math.log10(v) - y0) / (y1 - y0) * (H - B - 10); }
    var svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, "data-testid": "roofline-plot" });
    for (var e = x0; e <= x1; e++) {
      svg.appendChild(svgEl("text", { x: px(Math.pow(10, e)), y: H - B + 16, "text-anchor": "middle", "font-size": 10 }, "1e" + e));
    }
    for (var f = y0; f <= y1; f++) {
      svg.appendChild(svgEl("text", { x: L - 4, y: py(Math.pow(10, f)) + 3, "text-anchor": "end", "font-size": 10 }, "1e" + f));
    }
    svg.appendChild(svgEl("text", { x: (L + W) / 2, y: H - 6, "text-anchor": "middle", "font-size": 11 }, "FLOPs per byte"));
    svg.appendChild(svgEl("text", { x: 12, y: H / 2, "font-size": 11, transform: "rotate(-90 12 " + H / 2 + ")",
                                    "text-anchor": "middle" }, "FLOP/s"));
    Object.keys(rf.peaks).forEach(function (mode) {
      var peak = rf.peaks[mode], knee = peak / rf.bandwidth, left = Math.pow(10, x0), right = Math.pow(10, x1);
      var start = Math.max(left, Math.pow(10, y0) / rf.bandwidth);
      svg.appendChild(svgEl("polyline", { fill: "none", stroke: "#555", "stroke-width": 1.5, "data-testid": "roof",
        points: px(start) + "," + py(start * rf.bandwidth) + " " + px(knee) + "," + py(peak) + " " + px(right) + "," + py(peak) }));
      svg.appendChild(svgEl("text", { x: W - 12, y: py(peak) - 4, "text-anchor": "end", "font-size": 10 }, mode));
    });
    var longest = Math.max.apply(null, rf.points.map(function (p) { return p.time_ns; }));
    rf.points.forEach(function (p) {
      var dot = svgEl("circle", { cx: px(p.intensity), cy: py(p.flop_rate), r: 2 + 8 * Math.sqrt(p.time_ns / longest),
        fill: p.bound === "compute" ? "#c0392b" : "#2c7fb8", "fill-opacity": 0.6, "data-testid": "roofline-point" });
      dot.appendChild(svgEl("title", null, p.name + ": " + p.mode + ", " + p.bound + "-bound, " + fmtTime(p.time_ns)));
      svg.appendChild(dot);
    });
    box.appendChild(svg);
  }

  renderGpu();
  renderAdvice();
  renderSummary();
  renderSteps();
  renderTables();
  renderTimeline();
  renderMemory();
  renderCurves("counters", "Counters", data.counters);
  renderTableSection("metrics", "Derived metrics", data.metrics);
  renderTableSection("tuning", "Tuning candidates", data.tuning);
  renderRoofline();
  document.body.setAttribute("data-rendered", "true");
}());
