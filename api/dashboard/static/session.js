// Session page: count the time left and the idle countdown down between reloads, at the cloud's
// time scale (cluster seconds per wall second); reload when one reaches zero to show what happened.
"use strict";
(function () {
  const root = document.getElementById("session");
  if (!root || !root.dataset.live) return;
  const scale = parseFloat(root.dataset.scale) || 1;
  const started = Date.now();
  const clocks = Array.prototype.slice.call(document.querySelectorAll(".countdown[data-left]"))
    .filter(function (el) { return el.dataset.left !== ""; });
  if (!clocks.length) return;
  const timer = setInterval(function () {
    const passed = (Date.now() - started) / 1000 * scale;
    clocks.forEach(function (el) {
      const left = Math.max(0, parseFloat(el.dataset.left) - passed);
      el.textContent = Math.round(left) + " s";
      if (left <= 0) { clearInterval(timer); setTimeout(function () { location.reload(); }, 1000); }
    });
  }, 250);
})();
