// Submit page: a live estimate as the form changes. Without this script the "Preview estimate"
// button asks the server for the same panel in a full page.
"use strict";
(function () {
  const form = document.getElementById("submit-form");
  if (!form || !window.fetch) return;
  const panel = document.getElementById("estimate");
  const model = form.elements.namedItem("model");
  const hint = document.getElementById("model-hint");
  let timer = null;
  let controller = null;
  let generation = 0;

  function placeholders() {
    const option = model.selectedOptions[0];
    if (!option) return;
    const data = option.dataset;
    form.elements.namedItem("batch_size").placeholder = "default " + data.batch;
    form.elements.namedItem("seq_len").placeholder = data.seq ? "default " + data.seq + " (" + data.seqs + ")" : "not used";
    form.elements.namedItem("steps").placeholder = "default " + data.steps;
    if (hint) hint.textContent = data.description || "";
  }

  async function refresh() {
    const body = new URLSearchParams(new FormData(form));
    body.delete("action");
    if (controller) controller.abort();
    controller = new AbortController();
    const mine = ++generation;
    panel.setAttribute("aria-busy", "true");
    try {
      const response = await fetch(form.dataset.estimateUrl, {
        method: "POST",
        body: body,
        headers: { "X-CSRF-Token": form.dataset.csrf },
        credentials: "same-origin",
        signal: controller.signal,
      });
      if (mine !== generation) return;
      // 422: the form's values cannot be estimated; the panel says why.
      if (response.ok || response.status === 422) {
        panel.innerHTML = await response.text();  // server-rendered, escaped by the template engine
      } else {
        panel.textContent = "No estimate (HTTP " + response.status + "): reload the page if your session ended.";
      }
    } catch (error) {
      if (error.name !== "AbortError") panel.textContent = "Could not reach the server for an estimate.";
    } finally {
      if (mine === generation) panel.removeAttribute("aria-busy");
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }

  form.addEventListener("input", schedule);
  form.addEventListener("change", function (event) {
    if (event.target === model) placeholders();
    schedule();
  });
  placeholders();
  refresh();
})();
