// strata view: stages side by side, provenance highlighting, per-kernel pass steps.
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.texts;
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
  .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
const owner = {};            // stage -> {line: ["op"|"kernel", index]}
const stageLines = {};       // stage -> its text's lines
const chunks = {};           // stage -> [chunk element], filled only when scrolled near
const lit = {};              // stage -> Set of highlighted line numbers (0-based)
const state = { kernel: -1, op: -1, pass: 0 };
const CHUNK = 64;            // lines per lazily built block
const LINE = 16;             // px per line (fixed in page.css), so positions need no layout

function buildOwners() {
  for (const s of D.stages) { owner[s.name] = {}; lit[s.name] = new Set(); }
  for (const stage of ["torch", "tensor"]) {
    for (const [op, lines] of Object.entries(D.opLines[stage] || {})) {
      for (const i of lines) owner[stage][i] = ["op", +op];
    }
  }
  D.kernels.forEach((k, ki) => {
    for (const [stage, runs] of Object.entries(k.lines)) {
      for (const [a, b] of runs) for (let i = a; i <= b; i++) {
        if (!owner[stage][i]) owner[stage][i] = ["kernel", ki];
      }
    }
  });
}

// a stage's lines are built only for the chunks near its visible part: a whole model's CUDA
// (100k+ lines) costs nothing until scrolled to
function fill(chunk) {
  if (chunk.dataset.filled) return;
  const stage = chunk.dataset.stage, c = +chunk.dataset.c, own = owner[stage], hl = lit[stage];
  const lines = stageLines[stage];
  let html = "";
  for (let i = c; i < Math.min(c + CHUNK, lines.length); i++) {
    const cls = "ln" + (own[i] ? " own" : "") + (hl.has(i) ? " hl" : "");
    html += `<span class="${cls}" data-n="${i + 1}">${esc(lines[i])}</span>`;
  }
  chunk.innerHTML = html;
  chunk.dataset.filled = "1";
}

function buildStages() {
  buildOwners();
  const box = $("stages");
  let html = "";
  for (const s of D.stages) {
    const lines = stageLines[s.name] = T[s.text].split("\n");
    html += `<div class="stage" data-stage="${s.name}"><h3>${s.title} <small>(${lines.length} lines)</small></h3><pre>`;
    for (let c = 0; c < lines.length; c += CHUNK) {
      html += `<div class="chunk" data-stage="${s.name}" data-c="${c}" style="height: ${Math.min(CHUNK, lines.length - c) * LINE}px"></div>`;
    }
    html += "</pre></div>";
  }
  box.innerHTML = html;
  for (const el of box.querySelectorAll(".stage")) {
    const pre = el.querySelector("pre");
    chunks[el.dataset.stage] = Array.from(pre.children);
    const seen = new IntersectionObserver((entries) => {
      for (const e of entries) if (e.isIntersecting) fill(e.target);
    }, { root: pre, rootMargin: "600px 0px" });
    for (const c of chunks[el.dataset.stage]) seen.observe(c);
  }
  box.addEventListener("click", (ev) => {
    const ln = ev.target.closest(".ln");
    if (!ln) return;
    const stage = ln.closest(".stage").dataset.stage;
    const who = owner[stage][+ln.dataset.n - 1];
    if (!who) return;
    if (who[0] === "op") selectOp(who[1], stage); else selectKernel(who[1], stage);
  });
}

function lineEl(stage, i) {
  const chunk = chunks[stage][Math.floor(i / CHUNK)];
  return chunk && chunk.dataset.filled ? chunk.children[i % CHUNK] : null;
}

function expand(runsOrList) {
  const out = [];
  for (const r of runsOrList) {
    if (Array.isArray(r)) { for (let i = r[0]; i <= r[1]; i++) out.push(i); } else out.push(r);
  }
  return out;
}

function highlight(ops, kernels, origin) {
  for (const s of D.stages) {
    for (const i of lit[s.name]) { const el = lineEl(s.name, i); if (el) el.classList.remove("hl"); }
    lit[s.name] = new Set();
  }
  const add = (stage, lines) => { for (const i of lines) lit[stage].add(i); };
  for (const op of ops) for (const stage of ["torch", "tensor"]) {
    const l = (D.opLines[stage] || {})[op];
    if (l) add(stage, expand(l));
  }
  for (const k of kernels) for (const [stage, runs] of Object.entries(D.kernels[k].lines)) {
    add(stage, expand(runs));
  }
  for (const s of D.stages) {
    for (const i of lit[s.name]) { const el = lineEl(s.name, i); if (el) el.classList.add("hl"); }
    if (s.name === origin || !lit[s.name].size) continue;
    let first = Infinity;                          // bring it into view (its chunk fills itself)
    for (const i of lit[s.name]) if (i < first) first = i;
    chunks[s.name][0].parentElement.scrollTop = Math.max(0, first * LINE - 30);
  }
  document.querySelectorAll("nav li").forEach((li) => {
    const i = +li.dataset.i;
    li.classList.toggle("rel", li.dataset.kind === "op" ? ops.includes(i) : kernels.includes(i));
    li.classList.toggle("sel", li.dataset.kind === "op" ? i === state.op : i === state.kernel);
  });
}

function selectOp(i, origin) {
  state.op = i;
  state.kernel = D.ops[i].kernels.length ? D.ops[i].kernels[0] : -1;
  highlight([i], D.ops[i].kernels, origin);
  showKernel();
}

function selectKernel(i, origin) {
  state.kernel = i;
  state.op = -1;
  const fam = family(i);
  highlight(D.kernels[i].ops, origin === "loop" && fam ? fam.kernels : [i], origin);
  showKernel();
}

function family(ki) {
  if (ki < 0) return null;
  return D.families.find((f) => f.name === D.kernels[ki].family) || null;
}

// the pass list: the selected kernel's family, else the whole program's
function steps() {
  const fam = family(state.kernel);
  if (fam) return fam.passes.map(([num, changed, diff, notes]) => ({ num, changed, diff, notes }));
  return D.passes.map((p) => ({ num: p.num, changed: p.diff >= 0 ? 1 : 0, diff: p.diff, notes: [] }));
}

function showKernel() {
  const fam = family(state.kernel);
  const k = state.kernel >= 0 ? D.kernels[state.kernel] : null;
  $("pipetitle").textContent = k ? `Passes of ${fam ? fam.name : k.name}` : "Pass pipeline (whole program)";
  const st = steps();
  const first = st.findIndex((s) => s.changed);
  state.pass = first >= 0 ? first : 0;
  renderPasses();
  renderKnobs(k);
}

function renderPasses() {
  const st = steps();
  const byNum = Object.fromEntries(D.passes.map((p) => [p.num, p]));
  let html = "";
  st.forEach((s, i) => {
    const p = byNum[s.num] || { name: "?", ms: 0 };
    const cls = (s.changed ? "changed" : "same") + (i === state.pass ? " cur" : "");
    html += `<li class="${cls}" data-step="${i}"><span class="mark">${s.changed ? "\u25cf" : "\u25cb"}</span>` +
      `<span>${String(s.num).padStart(3, "0")} ${esc(p.name)}</span>` +
      `<span class="ms">${p.ms.toFixed(2)} ms</span></li>`;
    for (const n of s.notes) html += `<li class="note">${esc(T[n])}</li>`;
  });
  $("passes").innerHTML = html;
  const cur = $("passes").querySelector("li.cur");
  if (cur) cur.scrollIntoView({ block: "nearest" });
  const s = st[state.pass];
  const name = s ? (byNum[s.num] || {}).name : "";
  $("difftitle").textContent = s ? `Diff of ${String(s.num).padStart(3, "0")} ${name}${s.changed ? "" : " (changed nothing)"}` : "Diff";
  $("diff").innerHTML = s && s.diff >= 0 ? T[s.diff].split("\n").map((l) => {
    const c = l.startsWith("@@") ? "hunk" : l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : "";
    return c ? `<span class="${c}">${esc(l)}</span>` : esc(l) + "\n";
  }).join("") : "(no change)";
}

function renderKnobs(k) {
  if (!k) { $("knobs").innerHTML = "<p class='hint'>select a kernel or an op</p>"; $("tuning").innerHTML = ""; return; }
  const rows = k.knobs.map(([n, v, src, m]) =>
    `<tr><td>${esc(n)}</td><td>${esc(v)}</td><td class="src-${src.split(" ")[0]}">${esc(src)}</td><td>${esc(m)}</td></tr>`).join("");
  $("knobs").innerHTML = `<p><b>${esc(k.name)}</b> grid ${k.grid}, block ${k.block}, shared ${k.smem} B` +
    (k.src ? ` &mdash; <i>${esc(k.src)}</i>` : "") + "</p>" +
    (rows ? `<table><tr><th>knob</th><th>value</th><th>from</th><th>meaning</th></tr>${rows}</table>` : "<p class='hint'>no knobs</p>");
  if (D.bench && k.name in D.bench.kernels) {
    $("knobs").innerHTML += `<p><b>measured</b>: ${D.bench.kernels[k.name].toFixed(4)} ms run alone ` +
      `(median of 5 rounds on this CPU; the whole program ${D.bench.whole.strata.toFixed(4)} ms)</p>`;
  }
  const point = D.roofline && D.roofline.points ? D.roofline.points.find((p) => p.kernel === state.kernel) : null;
  if (point) {
    $("knobs").innerHTML += `<p><b>roofline</b>: ${point.flops.toPrecision(3)} FLOP, ${point.bytes} bytes ` +
      `(the cost model's count): ${point.intensity.toPrecision(3)} FLOP/byte, ` +
      `${point.gflops.toPrecision(3)} GFLOP/s, ${point.gbs.toPrecision(3)} GB/s</p>`;
  }
  document.querySelectorAll("#roofline circle.point").forEach((c) => c.classList.toggle("sel", +c.dataset.k === state.kernel));
  const counters = (D.counters || {})[k.name];
  if (counters) {
    $("knobs").innerHTML += `<p><b>simulator counters</b> (this run, --device sim)</p><table>` +
      counters.map(([n, v]) => `<tr><td>${esc(n)}</td><td>${esc(v)}</td></tr>`).join("") + "</table>";
  }
  const t = k.tuning;
  $("tuning").innerHTML = t ? `<p>tuning database: ${esc(t.label || "")} default ${(+t.default_ms).toFixed(4)} ms, ` +
    `tuned ${(+t.tuned_ms).toFixed(4)} ms over ${t.candidates} candidates; knobs ${esc(t.knobs || "")}</p>` + candidates(t) : "";
}

// the tuning database's candidates, fastest first; each timed in rounds interleaved with the default
function candidates(t) {
  if (!t.measured) return "<p class='hint'>this record keeps no candidates (tuned before they were kept)</p>";
  return "<table class='cands'><tr><th>candidate knobs</th><th>ms</th><th>/ default</th><th></th></tr>" +
    t.measured.map((c) => `<tr class="${c.winner ? "winner" : ""}${c.default ? " default" : ""}">` +
      `<td>${esc(c.knobs)}</td><td>${c.ms.toFixed(4)}</td><td>${c.ratio.toFixed(3)}</td>` +
      `<td>${[c.default ? "default" : "", c.winner ? "winner" : ""].filter(Boolean).join(", ")}</td></tr>`).join("") +
    "</table>";
}

function step(delta) {
  const n = steps().length;
  if (!n) return;
  state.pass = Math.max(0, Math.min(n - 1, state.pass + delta));
  renderPasses();
}

function buildSide() {
  $("ops").innerHTML = D.ops.map((o, i) =>
    `<li data-kind="op" data-i="${i}" title="${esc(o.where)}">${esc(o.name)} <small>${esc(o.op)}</small></li>`).join("");
  $("kernels").innerHTML = D.kernels.map((k, i) =>
    `<li data-kind="kernel" data-i="${i}" title="${esc(k.src)}">${esc(k.name)}</li>`).join("");
  $("side").addEventListener("click", (ev) => {
    const li = ev.target.closest("li");
    if (!li) return;
    if (li.dataset.kind === "op") selectOp(+li.dataset.i, ""); else selectKernel(+li.dataset.i, "");
  });
  $("search").addEventListener("input", () => {
    const q = $("search").value.trim().toLowerCase();
    document.querySelectorAll("nav li").forEach((li) => {
      li.classList.toggle("hidden", q !== "" && !li.textContent.toLowerCase().includes(q));
    });
  });
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    const li = document.querySelector("nav li:not(.hidden)");
    if (li) li.click();
  });
}

function buildMeta() {
  const v = D.verdict;
  let verdict = "not run (add --device cpu or sim)";
  if (v) {
    const worst = Math.max(0, ...v.outputs.map((o) => o.rel));
    verdict = `<span class="${v.passed ? "pass" : "fail"}">${v.passed ? "PASS" : "FAIL"}</span> ` +
      `vs float64 eager, rel err ${worst.toPrecision(3)}`;
  }
  const b = D.bench;
  if (b) {
    const w = b.whole, best = Math.min(w.eager, w["torch.compile"]);
    verdict += ` &middot; strata ${w.strata.toFixed(4)} ms, eager ${w.eager.toFixed(4)} ms, ` +
      `torch.compile ${w["torch.compile"].toFixed(4)} ms: <b>${(best / w.strata).toFixed(2)}x</b> the faster` +
      (b.busy ? ` <span class="fail">${esc(b.busy)}</span>` : "");
  }
  const ms = D.timings.map(([n, t]) => `${n} ${t.toFixed(1)} ms`).join(", ");
  $("meta").innerHTML = `target ${esc(D.target)} &middot; ${v ? "ran on " + esc(D.device) : "compiled only"} &middot; ` +
    `${D.ops.length} ops &rarr; ${D.kernels.length} kernels &middot; verdict: ${verdict}` +
    `<br><small>${esc(ms)} &middot; strata ${esc(D.version)}, ${esc(D.made)}` +
    (D.replayed ? "" : " &middot; per-kernel diffs could not be replayed: whole-program diffs only") + "</small>";
  $("fusion").innerHTML = D.fusion.length ? D.fusion.map((f) => `<li>${esc(f)}</li>`).join("") : "<li>no refusal logged</li>";
  $("log").textContent = T[D.log];
  const r = D.roofline;
  if (r) {
    $("roofbox").hidden = false;
    $("roofline").innerHTML = r.note ? `<p class="hint">${esc(r.note)}</p>` :
      `<p class="hint">each kernel's time alone (--bench) against the ceilings of ${esc(r.where)}; ` +
      "FLOPs and bytes as the cost model counts them (tune/cost.py); click a point to select its kernel</p>" + r.svg;
    $("roofline").addEventListener("click", (ev) => {
      const c = ev.target.closest("circle.point");
      if (c) selectKernel(+c.dataset.k, "");
    });
  }
}

document.addEventListener("keydown", (ev) => {
  if (ev.target === $("search")) { if (ev.key === "Escape") $("search").blur(); return; }
  if (ev.key === "j" || ev.key === "ArrowDown") { step(1); ev.preventDefault(); }
  else if (ev.key === "k" || ev.key === "ArrowUp") { step(-1); ev.preventDefault(); }
  else if (ev.key === "/") { $("search").focus(); ev.preventDefault(); }
});
$("passes").addEventListener("click", (ev) => {
  const li = ev.target.closest("li[data-step]");
  if (li) { state.pass = +li.dataset.step; renderPasses(); }
});

buildMeta();
buildSide();
buildStages();
if (D.kernels.length) selectKernel(0, ""); else showKernel();
window.strataViewReady = performance.now();
