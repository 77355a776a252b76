// Job page: follow the job live over server-sent events (state changes, log lines, progress and
// throughput). Without this script the page is complete but static; reloading it updates it.
"use strict";
(function () {
  const root = document.getElementById("job");
  if (!root || !root.dataset.live || !window.EventSource) return;
  const $ = function (id) { return document.getElementById(id); };
  const log = $("log");
  const timeline = $("timeline");
  const badge = $("job-state");
  const status = $("live-status");
  const bar = $("job-progress");
  const spark = $("throughput-spark");
  const samples = [];

  function clock(at) {
    const d = new Date(at);
    return isNaN(d) ? "" : d.toISOString().substring(11, 19);
  }

  function duration(s) {
    if (s === null || s === undefined) return "–";
    if (s === 0) return "0 s";
    if (s < 0.001) return Math.round(s * 1e6) + " µs";  // as the server's `duration` filter writes it
    if (s < 0.01) return (s * 1000).toFixed(2) + " ms";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " days";
  }

  function ipuHours(h) {  // as the page's `hours(6)` filter writes it
    if (typeof h !== "number") return "–";
    const digits = h && Math.abs(h) < 1e-6 ? 9 : 6;
    return h.toLocaleString("en", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  function line(list, entry, className, text) {
    const item = document.createElement("li");
    item.className = className;
    const time = document.createElement("time");
    time.dateTime = entry.at;
    time.textContent = list === log ? clock(entry.at) : entry.at.replace("T", " ").substring(0, 19) + " UTC";
    item.append(time, " " + text);
    const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
    list.append(item);
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  function setState(state) {
    badge.textContent = state;
    badge.className = "state state-" + state;
    root.dataset.state = state;
    const waiting = $("waiting");
    if (waiting && state !== "queued") waiting.hidden = true;  // it no longer waits
  }

  function drawSpark() {
    const line = spark.querySelector("polyline");
    const top = Math.max.apply(null, samples) || 1;
    const step = samples.length > 1 ? 300 / (samples.length - 1) : 0;
    line.setAttribute("points", samples.map(function (v, i) {
      return (i * step).toFixed(1) + "," + (38 - 36 * v / top).toFixed(1);
    }).join(" "));
  }

  const source = new EventSource(root.dataset.live);
  source.onopen = function () { status.textContent = "Live: updates as the job runs."; };
  source.onerror = function () { status.textContent = "Connection lost; reconnecting…"; };

  source.addEventListener("log", function (event) {
    const entry = JSON.parse(event.data);
    line(log, entry, "kind-log", entry.message);
  });

  source.addEventListener("state", function (event) {
    const entry = JSON.parse(event.data);
    line(log, entry, "kind-state", entry.message);
    // Every state event joins the timeline, as on the page the server renders; only those that
    // carry a state (not "placed on partition ...") change the badge.
    const state = entry.data && entry.data.state;
    line(timeline, entry, state ? "tl-" + state : "", entry.message);
    if (state) setState(state);
  });

  source.addEventListener("progress", function (event) {
    const p = JSON.parse(event.data);
    if (typeof p.percent === "number") {
      bar.value = p.percent;
      bar.textContent = p.percent.toFixed(1) + "%";
      $("progress-percent").textContent = p.percent.toFixed(1) + "% of steps";
    }
    $("progress-phase").textContent = p.phase ? " · " + p.phase : "";
    $("progress-step").textContent = (p.step !== undefined && p.step !== null && p.steps) ? " · step " + p.step + " of " + p.steps : "";
    $("progress-eta").textContent = (typeof p.eta_s === "number" && p.phase !== "done") ? " · about " + duration(p.eta_s) + " left (cluster time)" : "";
    if (typeof p.throughput === "number" && p.throughput > 0) {
      $("throughput").textContent = Math.round(p.throughput).toLocaleString("en") + " samples/s";
      samples.push(p.throughput);
      if (samples.length > 120) samples.shift();
      drawSpark();
    }
    if (typeof p.cluster_s === "number") $("cluster-time").textContent = duration(p.cluster_s);
    if (typeof p.memory_per_ipu_bytes === "number") {
      $("memory").textContent = Math.round(p.memory_per_ipu_bytes / 1048576).toLocaleString("en") + " MB";
    }
  });

  // Where it runs, how many attempts, the IPU-hours billed so far: sent when they change.
  source.addEventListener("job", function (event) {
    const facts = JSON.parse(event.data);
    $("partition").textContent = facts.partition || "–";
    $("job-machine").textContent = facts.machine || "any";
    $("attempts").textContent = String(facts.attempts);
    $("ipu-hours").textContent = ipuHours(facts.used_ipu_hours);
  });

  // The session was signed out, its key revoked or its tenant suspended: stop following, and
  // reload, which leads to the sign-in page (or says why not).
  source.addEventListener("denied", function (event) {
    const problem = JSON.parse(event.data);
    source.close();
    status.textContent = problem.detail + " Reloading…";
    setTimeout(function () { window.location.reload(); }, 1200);
  });

  source.addEventListener("end", function (event) {
    const end = JSON.parse(event.data);
    source.close();
    setState(end.state);
    if (end.state === "succeeded") {
      bar.value = 100;
      $("progress-percent").textContent = "100%";
    }
    status.textContent = "The job " + end.state + ". Loading the final figures…";
    setTimeout(function () { window.location.reload(); }, 1200);
  });
})();
