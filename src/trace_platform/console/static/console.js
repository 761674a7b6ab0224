// The console's only script (served from the package; the CSP allows no inline script).
// - [data-sse]: an element whose content a server-sent event stream replaces ("tree" events
//   carry the re-rendered partial; "done" ends it).
// - form[data-confirm]: asks before a change (cutover, rollback, cancel, pause).
"use strict";

function follow(el) {
  const source = new EventSource(el.dataset.sse);
  source.addEventListener("tree", (event) => {
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

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-sse]").forEach(follow);
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) {
        event.preventDefault();
      }
    });
  });
});
