// The console's only script (served from the package; the CSP allows no inline script).
// - [data-sse]: an element whose content a server-sent event stream replaces (events named by
//   data-sse-event, "tree" by default, carry the re-rendered partial; "done" ends it).
// - form[data-confirm]: asks before a change (cutover, rollback, cancel, pause); listened for
//   on the document, so a form a live partial brings in asks too.
"use strict";

function follow(el) {
  const source = new EventSource(el.dataset.sse);
  source.addEventListener(el.dataset.sseEvent || "tree", (event) => {
    el.innerHTML = event.data;
  });
  source.addEventListener("done", () => {
    source.close();
    el.dataset.live = "done";
  });
  source.addEventListener("error", () => {
    // A closed stream reconnects by itself (EventSource); say so while it does.
    el.dataset.live = "reconnecting";
  });
  source.addEventListener("open", () => {
    el.dataset.live = "open";
  });
}

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form instanceof HTMLFormElement && form.dataset.confirm !== undefined) {
    if (!window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  }
});

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-sse]").forEach(follow);
});
