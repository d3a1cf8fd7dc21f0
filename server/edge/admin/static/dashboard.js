// liveloop operator console: polls the admin API with the session cookie and draws it.
// Charts: uPlot (vendored, MIT). Writes send the X-Liveloop-Dashboard header (see server/edge/auth.py).
"use strict";

const REFRESH_MS = 2000;
const LEARNING_MS = 10000; // the learning view decodes up to 2,000 replies per segment: read it less often
// statuses: the version statuses as the server defines them (GET /admin/statuses), by name
// adapters: GET /admin/adapters (per-segment LoRA adapters; "none": the panel stays hidden)
// fleet: GET /admin/replicas (every serving process: what it serves, its load, its health)
// evaluations: GET /admin/evaluations (the release gate's latest evaluation of each recent version)
// learning: GET /admin/learning (per segment and version: reward, moving reward, behaviours served)
const state = { versions: [], drift: null, stats: null, events: [], markers: [], statuses: null, adapters: null, fleet: null, evaluations: [], learning: null, refreshes: 0 };
window.dashboard = state; // for people (and tests) poking at the page

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

// Replaces a container's children only when what it would show changed: the page refreshes every 2 s,
// and a button re-created under the pointer loses the click (and any element a script holds goes stale).
function show(parent, nodes) {
  const next = document.createElement(parent.tagName);
  next.replaceChildren(...nodes);
  if (next.innerHTML !== parent.innerHTML) parent.replaceChildren(...nodes);
}

const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
const segmentName = (s) => (s === "*" ? "all ratings" : s);
const when = (t) => new Date(t * 1000).toLocaleTimeString();
const lineage = (v) => v.segment ?? "base"; // a version's lineage: a segment's adapters, or the base weights'
const servable = (v) => Boolean(v && state.statuses[v.status] && state.statuses[v.status].servable);

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Liveloop-Dashboard": "1" },
    body: JSON.stringify(body),
  };
  const r = await fetch(path, { credentials: "same-origin", ...init });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((data.error && data.error.message) || `${path}: HTTP ${r.status}`);
  return data;
}

function showError(err) {
  const box = document.getElementById("error");
  box.hidden = !err;
  box.textContent = err ? String(err.message || err) : "";
}

// -- charts ------------------------------------------------------------------------------------
function marksPlugin(marks) {
  // vertical lines at marks() = [{x, label, kind}]: dashed ones (a version went live, or the version that
  // served the rated responses changed), solid red ones at alarms (kind "alarm")
  return {
    hooks: {
      draw: [(u) => {
        const { ctx } = u;
        const { left, top, width, height } = u.bbox;
        ctx.save();
        ctx.font = `${11 * devicePixelRatio}px system-ui`;
        for (const m of marks()) {
          const x = u.valToPos(m.x, "x", true);
          if (x < left || x > left + width) continue;
          const alarm = m.kind === "alarm";
          ctx.strokeStyle = ctx.fillStyle = alarm ? "#d33" : "#5566aa";
          ctx.setLineDash(alarm ? [] : [5, 4]);
          ctx.lineWidth = alarm ? 2 : 1;
          ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
          ctx.fillText(m.label, x + 3, top + 12 * devicePixelRatio);
        }
        ctx.restore();
      }],
    },
  };
}

// versions going live and alarms, on the time axis
const timeMarks = () => state.markers.map((m) => ({ x: m.t, label: m.label, kind: m.kind }));

let rewardChart = null;

function xRange() {
  // the buckets, the markers and now: a version that went live after the last rating still shows
  const ts = [...((state.drift && state.drift.series) || []).map((b) => b.t), ...state.markers.map((m) => m.t), Date.now() / 1000];
  const lo = Math.min(...ts);
  const hi = Math.max(...ts);
  return [lo - 1, hi + 1];
}
let volumeChart = null;

function chartWidth(id) {
  return Math.max(300, document.getElementById(id).clientWidth);
}

function drawCharts() {
  const series = (state.drift && state.drift.series) || [];
  const t = series.map((b) => b.t);
  const reward = [t, series.map((b) => b.rate), series.map((b) => b.high), series.map((b) => b.low)];
  const volume = [t, series.map((b) => b.n)];
  if (!rewardChart) {
    rewardChart = new uPlot({
      width: chartWidth("reward-chart"), height: 260,
      scales: { x: { time: true, range: () => xRange() }, y: { range: [0, 1] } },
      series: [
        {},
        { label: "reward rate", stroke: "#1f5fd6", width: 2, points: { show: true } },
        { label: "high", stroke: "#1f5fd633" },
        { label: "low", stroke: "#1f5fd633" },
      ],
      bands: [{ series: [2, 3], fill: "#1f5fd61a" }],
      plugins: [marksPlugin(timeMarks)],
    }, reward, document.getElementById("reward-chart"));
    volumeChart = new uPlot({
      width: chartWidth("volume-chart"), height: 160,
      scales: { x: { time: true, range: () => xRange() }, y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] } },
      series: [{}, { label: "ratings", stroke: "#555", fill: "#5553", paths: uPlot.paths.bars({ size: [0.8] }) }],
      plugins: [marksPlugin(timeMarks)],
    }, volume, document.getElementById("volume-chart"));
  } else {
    rewardChart.setData(reward);
    volumeChart.setData(volume);
  }
}

function collectMarkers() {
  const markers = [];
  for (const v of state.versions) {
    if (v.version > 0) markers.push({ kind: "version", t: v.created, label: v.segment ? `${v.segment} v${v.version}` : `v${v.version}`, version: v.version });
  }
  for (const e of state.events) {
    if (e.kind === "alarm") markers.push({ kind: "alarm", t: e.at, label: `alarm: ${segmentName(e.detail.segment)} ${e.detail.direction}` });
    if (e.kind === "learner_behind") markers.push({ kind: "alarm", t: e.at, label: `learner behind: ${e.detail.lane}` });
    if (e.kind === "rollback" || e.kind === "guard_rollback") {
      const where = e.detail && e.detail.segment ? `${e.detail.segment} ` : "";
      markers.push({ kind: "version", t: e.at, label: `${where}rollback→v${e.version}`, version: e.version });
    }
  }
  markers.sort((a, b) => a.t - b.t);
  state.markers = markers;
  const list = document.getElementById("version-markers");
  show(list, markers.map((m) => el("li", { class: m.kind, "data-version": m.version ?? "" }, `${m.label} @ ${when(m.t)}`)));
}

// -- panels ------------------------------------------------------------------------------------
function dl(target, pairs) {
  show(document.getElementById(target), pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function drawHeader() {
  const s = state.stats;
  const serving = document.getElementById("serving");
  serving.textContent = `serving v${s.serving}`;
  serving.dataset.version = s.serving;
  const learning = document.getElementById("learning");
  learning.textContent = s.learning_paused ? "learning paused" : "learning on";
  learning.classList.toggle("paused", s.learning_paused);
  document.getElementById("pause").disabled = s.learning_paused;
  document.getElementById("resume").disabled = !s.learning_paused;
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

function drawLearner() {
  const s = state.stats;
  const l = s.learner || {};
  dl("learner", [
    ["running", l.running ? "yes" : (l.state || "no")],
    ["restarts", l.restarts ?? 0],
    ["paused", s.learning_paused ? "yes" : "no"],
    ["learner version", l.version ?? "–"],
    ["steps / samples", l.running ? `${l.step} / ${l.samples}` : "–"],
    ["feedback cursor", l.cursor ?? "–"],
    ["idle", l.running ? pct(l.idle_fraction) : "–"],
    ["responses / ratings", `${s.counts.responses} / ${s.counts.feedback} (${pct(s.rating_rate)} rated)`],
  ]);
}

// the learner's pace (GET /admin/stats' learner.pace, server/control/learner_watch.py): per lane, what arrives and
// what it trains over the short / long window, the backlog, seconds per rating, and the behind / refused alarms
const rate = (x) => (x === null || x === undefined ? "–" : Number(x).toPrecision(2));
const twoWindows = (p, key, f) => `${f(p.short[key])} / ${f(p.long[key])}`;

function drawPace() {
  const pace = (state.stats.learner || {}).pace;
  const summary = document.getElementById("pace-summary");
  const panel = document.getElementById("pace-panel");
  if (!pace) {
    summary.textContent = "(no learner watched yet)";
    show(document.querySelector("#pace tbody"), []);
    return;
  }
  panel.dataset.behind = pace.behind;
  summary.textContent = `(last ${pace.short_seconds} s / ${pace.long_seconds} s; behind: pace under ${pace.behind_pace} over ` +
    `${pace.long_seconds} s with at least ${pace.behind_backlog} ratings waiting; measured ${when(pace.at)})`;
  const refused = {}; // lane -> its newest learner_step_refused event
  for (const e of state.events) if (e.kind === "learner_step_refused") refused[e.detail.lane] = e;
  const rows = pace.lanes.map((l) => {
    const status = l.paused ? "paused" : l.behind ? `BEHIND since ${when(l.behind_since)}` : l.long.full ? "keeping up" : "measuring";
    const last = refused[l.lane];
    const refusedText = last ? `${l.refused_steps} (last ${when(last.at)}: step KL ${num(last.detail.step_kl)}, lr ${num(last.detail.lr)})` : l.refused_steps;
    return el("tr", { class: l.behind ? "behind" : "", "data-lane": l.lane },
      el("td", { title: l.answered ? "" : "the learner did not answer: the store's published cursor" }, l.segment ?? "all", l.answered ? "" : " *"),
      el("td", {}, twoWindows(l, "arriving", rate)), el("td", {}, twoWindows(l, "trained", rate)),
      el("td", { class: l.long.pace !== null && l.long.pace < pace.behind_pace ? "worse" : "" }, twoWindows(l, "pace", rate)),
      el("td", { class: "backlog" }, `${l.backlog}${l.backlog_capped ? "+" : ""}`),
      el("td", {}, twoWindows(l, "seconds_per_rating", rate)),
      el("td", { class: l.behind ? "worse" : "" }, status), el("td", { class: last ? "refused" : "" }, refusedText));
  });
  show(document.querySelector("#pace tbody"), rows);
}

function drawDetector() {
  const d = state.drift;
  const o = d.overall;
  dl("detector", [
    ["detector", `${d.detector} (δ=${d.delta}, threshold ${d.threshold})`],
    ["ratings seen", o.ratings],
    ["reference rate", o.reference === null ? "–" : pct(o.reference)],
    ["drift ↑ / ↓", `${o.up.toFixed(1)} / ${o.down.toFixed(1)}${o.warming_up ? " (warming up)" : ""}`],
    ["alarms", d.alarms.length],
  ]);
  const rows = Object.entries(d.segments).map(([name, s]) =>
    el("tr", {}, el("td", {}, name), el("td", {}, s.n), el("td", {}, `${pct(s.rate)} [${pct(s.low)}, ${pct(s.high)}]`),
      el("td", {}, `${s.detector.up.toFixed(1)} / ${s.detector.down.toFixed(1)}`)));
  show(document.querySelector("#segments tbody"), rows);
  document.getElementById("segment-key").textContent = d.segment_key ? `(metadata "${d.segment_key}")` : "";
}

function drawAdapters() {
  const a = state.adapters;
  const on = a.adapters !== "none";
  document.getElementById("adapters-panel").hidden = !on;
  document.getElementById("versions").classList.toggle("no-segments", !on);
  document.getElementById("adapters-mode").textContent = on ? `(${a.adapters}; base weights v${a.base_version})` : "";
  const byVersion = Object.fromEntries(state.versions.map((v) => [v.version, v]));
  const rows = a.segments.map((s) => {
    const seg = s.segment;
    const buttons = [
      s.paused
        ? el("button", { type: "button", class: "segment-resume", "data-segment": seg, onclick: () => setSegmentPaused(seg, false) }, "Resume")
        : el("button", { type: "button", class: "segment-pause", "data-segment": seg, onclick: () => setSegmentPaused(seg, true) }, "Pause"),
    ];
    // back one step: the serving adapter's parent when it is an adapter of this segment that can serve
    const parent = s.serving === null ? null : byVersion[(byVersion[s.serving] || {}).parent];
    if (parent && parent.segment === seg && servable(parent)) {
      buttons.push(el("button", { type: "button", class: "segment-rollback", "data-segment": seg, "data-version": parent.version,
        onclick: () => rollback(parent.version, seg) }, `Roll back to v${parent.version}`));
    }
    if (s.serving !== null) {
      buttons.push(el("button", { type: "button", class: "segment-base", "data-segment": seg, "data-version": a.base_version,
        onclick: () => rollback(a.base_version, seg) }, "Serve the base"));
    }
    const l = s.latest;
    const r = l && l.reward;
    return el("tr", { class: s.paused ? "paused" : "", "data-segment": seg, "data-serving": s.serving ?? "" },
      el("td", {}, seg), el("td", {}, s.serving === null ? `base (v${s.policy_version})` : `v${s.serving}`),
      el("td", { class: "learning" }, s.paused ? "paused" : "on"), el("td", {}, s.versions),
      el("td", {}, l ? `v${l.version} (${l.status})` : "–"),
      el("td", {}, r && r.n ? `${pct(r.rate)} [${pct(r.low)}, ${pct(r.high)}] (${r.n})` : "–"),
      el("td", {}, ...buttons));
  });
  show(document.querySelector("#adapters tbody"), rows);
}

function drawFleet() {
  const f = state.fleet;
  const up = f.data.filter((r) => r.state !== "down");
  const versions = [...new Set(up.map((r) => r.serving_version))];
  document.getElementById("fleet-summary").textContent =
    `(${up.length} of ${f.data.length} up; ${versions.length === 1 ? "all on v" + versions[0] : "versions " + versions.map((v) => "v" + v).join(", ")}; this page: ${f.replica})`;
  const rows = f.data.map((r) => {
    const adapters = Object.entries(r.adapter_versions).map(([seg, v]) => `${seg}: ${v === null ? "base" : "v" + v}`).join(", ");
    return el("tr", { class: `replica ${r.state}`, "data-replica": r.id, "data-serving": r.serving_version ?? "" },
      el("td", {}, r.id), el("td", { class: "state" }, r.state), el("td", {}, r.serving_version === null ? "–" : `v${r.serving_version}`),
      el("td", {}, adapters || "–"), el("td", {}, r.in_flight), el("td", {}, `${r.host} / ${r.pid}`),
      el("td", {}, `${r.heartbeat_age_seconds.toFixed(1)} s ago`));
  });
  show(document.querySelector("#fleet tbody"), rows);
}

// the newest multi-turn episodes: one row each, its turns' tool calls and its rating
function drawEpisodes() {
  const rows = state.episodes.map((e) => {
    const calls = e.turns.flatMap((t) => t.tool_calls);
    return el("tr", { "data-episode": e.id, "data-last-turn": e.last_turn },
      el("td", {}, e.last_turn), el("td", { class: "turns" }, e.turn_count), el("td", {}, e.tokens),
      el("td", { class: "calls" }, calls.length ? calls.join(", ") : "–"), el("td", {}, e.versions.map((v) => "v" + v).join(", ")),
      el("td", { class: "reward" }, e.reward === null ? "–" : e.reward ? "👍" : "👎"), el("td", {}, e.branches));
  });
  show(document.querySelector("#episodes tbody"), rows);
}

const num = (x) => (x === null || x === undefined ? "–" : String(Number(Number(x).toPrecision(4))));

// the newest evaluated version's checks: its value against the live version's and the base model's
function drawEvaluation() {
  const e = state.evaluations[0];
  const summary = document.getElementById("evaluation-summary");
  const panel = document.getElementById("evaluation-panel");
  if (!e) {
    summary.textContent = "(no version evaluated yet)";
    panel.removeAttribute("data-version");
    show(document.querySelector("#evaluation tbody"), []);
    return;
  }
  panel.dataset.version = e.version;
  panel.dataset.passed = e.passed;
  const live = e.live_version === null ? "no live version" : `against live v${e.live_version}`;
  summary.textContent = `v${e.version} ${live}: ${e.passed ? "passed" : "failed (" + e.failed.join(", ") + ")"}; ` +
    `${e.seconds.toFixed(1)} s, ${e.engine_seconds.toFixed(1)} s on the engines; ${when(e.created)}`;
  const rows = e.checks.map((c) => el("tr", { class: c.passed ? "check-pass" : "check-fail", "data-check": c.name },
    el("td", {}, c.name), el("td", {}, num(c.value)), el("td", {}, num(c.live)), el("td", {}, num(c.base)),
    el("td", {}, c.bound || "–"), el("td", { class: c.passed ? "better" : "worse" }, c.passed ? "pass" : "FAIL")));
  show(document.querySelector("#evaluation tbody"), rows);
}

function evaluationCell(v) {
  const e = state.evaluations.find((x) => x.version === v.version);
  if (!e) return el("td", { class: "evaluation" }, "–");
  return el("td", { class: `evaluation ${e.passed ? "better" : "worse"}`, title: e.checks.map((c) => `${c.name}: ${num(c.value)}`).join("\n") },
    e.passed ? "passed" : `failed: ${e.failed.join(", ")}`);
}

function drawVersions() {
  const rows = [...state.versions].reverse().map((v) => {
    const r = v.reward;
    const cmp = v.vs_parent;
    const cmpCell = cmp
      ? el("td", { class: cmp.p_two_sided < 0.05 ? (cmp.difference < 0 ? "worse" : "better") : "" },
          `${cmp.difference >= 0 ? "+" : ""}${(100 * cmp.difference).toFixed(1)} pts (p=${cmp.p_two_sided.toFixed(3)})`)
      : el("td", {}, "–");
    const canServe = !v.serving && servable(v) && v.rollback_target !== false;  // pruned checkpoints are not offered
    // an adapter version is compared with what serves its segment (its rollback moves that segment only)
    const current = v.segment === null ? state.stats.serving : servingAdapter(v.segment);
    const action = canServe
      ? el("button", { type: "button", class: "rollback", "data-version": v.version, "data-segment": lineage(v),
          onclick: () => rollback(v.version, v.segment) },
          current !== null && v.version < current ? "Roll back to this" : "Serve this")
      : "";
    return el("tr", { class: `${v.status}${v.serving ? " serving" : ""}`, "data-version": v.version, "data-segment": lineage(v) },
      el("td", {}, `v${v.version}`), el("td", {}, v.parent === null ? "–" : `v${v.parent}`),
      el("td", { class: "segment-col" }, lineage(v)),
      el("td", { class: "status", title: (state.statuses[v.status] || {}).description || "" }, v.status),
      el("td", {}, when(v.created)), el("td", {}, v.responses), el("td", {}, r.n),
      el("td", {}, r.n ? `${pct(r.rate)} [${pct(r.low)}, ${pct(r.high)}]` : "–"), cmpCell, evaluationCell(v), el("td", {}, action));
  });
  show(document.querySelector("#versions tbody"), rows);
}

function drawEvents() {
  const items = [...state.events].reverse().slice(0, 50).map((e) => {
    let text = `${when(e.at)} ${e.kind}`;
    if (e.version !== null) text += ` v${e.version}`;
    if (e.kind === "alarm") text += `: ${segmentName(e.detail.segment)} reward went ${e.detail.direction} (${pct(e.detail.before)} → ${pct(e.detail.after)})`;
    if (e.kind === "rollback" && e.detail.segment) text += ` for segment ${e.detail.segment}`;
    if (e.kind === "rollback") text += ` (rolled back: ${(e.detail.rolled_back || []).map((v) => "v" + v).join(", ") || "none"})`;
    if ((e.kind === "pause" || e.kind === "resume") && e.detail && e.detail.learner) text += ` (${e.detail.learner})`;
    if (e.kind === "learner_behind") text += `: ${e.detail.lane} trains ${rate(e.detail.long.trained)} of ${rate(e.detail.long.arriving)} ratings / s, ${e.detail.backlog} waiting`;
    if (e.kind === "learner_caught_up") text += `: ${e.detail.lane}, ${e.detail.backlog} waiting, after ${Math.round(e.detail.seconds_behind ?? 0)} s behind`;
    if (e.kind === "learner_step_refused") text += `: ${e.detail.lane}, ${e.detail.count} refused (step KL ${num(e.detail.step_kl)} > ${num(e.detail.max_step_kl)}, lr ${num(e.detail.lr)})`;
    if (e.detail && e.detail.reason) text += ` – ${e.detail.reason}`;
    return el("li", { class: e.kind }, text);
  });
  show(document.getElementById("events"), items);
}

// -- learning per segment -------------------------------------------------------------------------
const learningCharts = new Map(); // segment -> its uPlot moving-reward chart

function versionChanges(points) {
  // on the rating axis: where the version that served the rated responses changes
  return points.filter((p, i) => i === 0 || p.version !== points[i - 1].version).map((p) => ({ x: p.index, label: `v${p.version}` }));
}

function learningTable(seg, behaviours) {
  const head = el("tr", {}, el("th", {}, "version"), el("th", {}, "responses"), el("th", {}, "ratings"), el("th", {}, "reward [95% CI]"),
    ...behaviours.map((b) => el("th", {}, b)));
  const rows = [...seg.versions].reverse().map((v) => {
    const r = v.reward;
    return el("tr", { "data-version": v.version },
      el("td", {}, `v${v.version}`), el("td", {}, v.responses), el("td", {}, r.n),
      el("td", {}, r.n ? `${pct(r.rate)} [${pct(r.low)}, ${pct(r.high)}]` : "–"),
      ...behaviours.map((b) => {
        const x = v.behaviours[b];
        return el("td", { "data-behaviour": b }, x && x.n ? `${pct(x.rate)} [${pct(x.low)}, ${pct(x.high)}]` : "–");
      }));
  });
  return el("table", { class: "learning-versions" }, el("thead", {}, head), el("tbody", {}, ...rows));
}

function drawLearning() {
  const l = state.learning;
  if (!l) return;
  document.getElementById("learning-summary").textContent =
    `(newest ${l.max_responses} responses per segment; behaviours: ${l.behaviours.length ? l.behaviours.join(", ") : "none declared"})`;
  const box = document.getElementById("learning-segments");
  const seen = new Set();
  for (const seg of l.data) {
    seen.add(seg.segment);
    let block = box.querySelector(`.learning-segment[data-segment="${CSS.escape(seg.segment)}"]`);
    if (!block) {
      block = el("div", { class: "learning-segment", "data-segment": seg.segment },
        el("h3", {}, ""), el("div", { class: "chart" }), el("div", { class: "table" }));
      box.append(block);
    }
    block.querySelector("h3").textContent = `${seg.segment} (${seg.responses} responses, ${seg.ratings} ratings)`;
    show(block.querySelector(".table"), [learningTable(seg, l.behaviours)]);
    block.querySelector(".chart").hidden = !seg.moving.length; // no ratings yet: the table says so
    const data = [seg.moving.map((p) => p.index), seg.moving.map((p) => p.reward)];
    let chart = learningCharts.get(seg.segment);
    if (!chart) {
      const points = { current: seg.moving };
      const target = block.querySelector(".chart");
      const plot = new uPlot({
        width: Math.max(300, target.clientWidth || box.clientWidth), height: 160,
        scales: { x: { time: false }, y: { range: [0, 1] } },
        axes: [{ label: "rating", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }, { label: "moving reward" }],
        legend: { show: false },
        series: [{ label: "rating" }, { label: "moving reward", stroke: "#1f5fd6", width: 2 }],
        plugins: [marksPlugin(() => versionChanges(points.current))],
      }, data, target);
      chart = { plot, points };
      learningCharts.set(seg.segment, chart);
    } else {
      chart.points.current = seg.moving;
      chart.plot.setData(data);
    }
  }
  for (const block of box.querySelectorAll(".learning-segment")) {
    if (!seen.has(block.dataset.segment)) {
      const chart = learningCharts.get(block.dataset.segment);
      if (chart) chart.plot.destroy();
      learningCharts.delete(block.dataset.segment);
      block.remove();
    }
  }
}

async function refreshLearning() {
  try {
    const input = document.getElementById("learning-window");
    const window_ = Math.max(1, Math.min(10000, parseInt(input.value, 10) || 50));
    state.learning = await api(`/admin/learning?window=${window_}`);
    drawLearning();
  } catch (err) {
    showError(err);
  }
}

document.getElementById("learning-window").addEventListener("change", refreshLearning);

// -- actions -----------------------------------------------------------------------------------
async function act(path, body) {
  try {
    await api(path, body);
    await refresh();
  } catch (err) {
    showError(err);
  }
}

function servingAdapter(segment) {
  const s = state.adapters && state.adapters.segments.find((x) => x.segment === segment);
  return s ? s.serving : null;
}

// segment: move that segment's adapter lineage only (with the base version: serve it no adapter)
function rollback(version, segment = null) {
  const question = segment === null
    ? `Serve version ${version} again? Later versions are marked rolled back and the learner continues from v${version}.`
    : `Serve segment ${segment} version ${version}? Its later adapter versions are marked rolled back and its lane continues from v${version}; other segments are not touched.`;
  if (!window.confirm(question)) return;
  const body = segment === null ? { version, reason: "dashboard" } : { version, segment, reason: "dashboard" };
  // what this page saw serving that lineage: the server refuses (409 serving_changed) if another serves now
  const seen = segment === null ? state.stats.serving : (servingAdapter(segment) ?? state.stats.serving);
  if (Number.isInteger(seen)) body.expect_serving = seen;
  act("/admin/rollback", body);
}

function setSegmentPaused(segment, paused) {
  act(paused ? "/admin/learning/pause" : "/admin/learning/resume", { segment, reason: "dashboard" });
}

document.getElementById("pause").addEventListener("click", () => act("/admin/learning/pause", { reason: "dashboard" }));
document.getElementById("resume").addEventListener("click", () => act("/admin/learning/resume", { reason: "dashboard" }));

// -- refresh -----------------------------------------------------------------------------------
async function loadStatuses() {
  const body = await api("/admin/statuses");
  state.statuses = Object.fromEntries(body.data.map((s) => [s.status, s]));
}

async function refresh() {
  try {
    if (!state.statuses) await loadStatuses(); // once: they are fixed while the server runs
    const [stats, drift, versions, events, adapters, fleet, evaluations, episodes] = await Promise.all([
      api("/admin/stats"), api("/admin/drift"), api("/admin/versions"), api("/admin/events?limit=500"), api("/admin/adapters"),
      api("/admin/replicas"), api("/admin/evaluations"), api("/admin/episodes?limit=20"),
    ]);
    Object.assign(state, { stats, drift, versions: versions.data, events: events.data, adapters, fleet, evaluations: evaluations.data,
                           episodes: episodes.data });
    drawHeader(); drawLearner(); drawPace(); drawDetector(); drawFleet(); drawAdapters(); drawEvaluation(); drawEpisodes(); drawVersions(); drawEvents();
    collectMarkers(); drawCharts();
    document.body.dataset.loaded = "true";
    state.refreshes += 1;
    showError(null);
  } catch (err) {
    showError(err);
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
refreshLearning();
setInterval(refreshLearning, LEARNING_MS);
window.addEventListener("resize", () => {
  if (rewardChart) rewardChart.setSize({ width: chartWidth("reward-chart"), height: 260 });
  if (volumeChart) volumeChart.setSize({ width: chartWidth("volume-chart"), height: 160 });
  for (const c of learningCharts.values()) c.plot.setSize({ width: Math.max(300, c.plot.root.parentElement.clientWidth), height: 160 });
});
