// Starts Swagger UI on /docs (a file of our own: the page's Content-Security-Policy allows no
// inline script). The spec is this server's /openapi.json; nothing is fetched from another site.
"use strict";
window.addEventListener("load", function () {
  const root = document.getElementById("swagger-ui");
  window.ui = window.SwaggerUIBundle({
    url: root.dataset.spec,
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [window.SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    validatorUrl: null,
  });
});
