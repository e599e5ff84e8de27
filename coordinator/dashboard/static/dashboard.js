// Live updates: one EventSource per page, fed by the dashboard process's single Redis
// subscription. On a change that concerns this page, the page's live region is
// re-rendered by the server (escaped there) and swapped in; a slow refresh covers
// anything missed. No other script runs on these pages.
(function () {
  "use strict";
  var body = document.body;
  document.querySelectorAll("[data-autosubmit]").forEach(function (el) {
    el.addEventListener("change", function () { el.form.submit(); });
  });
  var kind = body.getAttribute("data-live");
  var region = document.getElementById("live");
  if (!kind || !region || !window.EventSource) { return; }
  var base = body.getAttribute("data-base") || "";
  var tenant = body.getAttribute("data-tenant") || "";
  var dot = document.getElementById("live-state");
  var source = null, watched = "", pending = null, inflight = false, again = false;
  var trailing = null;

  function roots() {
    var el = region.querySelector("[data-roots]");
    return el ? el.getAttribute("data-roots") : "";
  }
  function openIds() {
    var closed = {};
    region.querySelectorAll("details[data-id]").forEach(function (d) {
      if (!d.open) { closed[d.getAttribute("data-id")] = true; }
    });
    return closed;
  }
  function connect() {
    watched = roots();
    if (source) { source.close(); }
    var url = base + "/api/live?view=" + encodeURIComponent(kind) +
      "&tenant=" + encodeURIComponent(tenant) + "&roots=" + encodeURIComponent(watched);
    source = new EventSource(url);
    // Once the stream is open, every later change reaches this page; one refresh
    // catches what changed before (between the page's render and now, or while the
    // stream was reconnecting).
    source.onopen = function () { dot.className = "live-state on"; schedule(0); };
    source.onerror = function () { dot.className = "live-state off"; };
    source.onmessage = function () {
      schedule(150);
      // The server shares identical reads for 0.25 s: one more refresh after that
      // shows a read made after the event, even if the first one got a shared read.
      clearTimeout(trailing);
      trailing = setTimeout(function () { schedule(0); }, 400);
    };
  }
  function schedule(ms) {
    if (pending) { return; }
    pending = setTimeout(refresh, ms);
  }
  function refresh() {
    pending = null;
    if (inflight) { again = true; return; }
    inflight = true;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    url.searchParams.delete("msg");
    fetch(url.toString(), {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (html) {
        var closed = openIds();
        region.innerHTML = html;
        region.querySelectorAll("details[data-id]").forEach(function (d) {
          if (closed[d.getAttribute("data-id")]) { d.open = false; }
        });
        body.setAttribute("data-refreshed", String(Date.now()));
        if (roots() !== watched) { connect(); }
      })
      .catch(function () { dot.className = "live-state off"; })
      .then(function () {
        inflight = false;
        if (again) { again = false; schedule(0); }
      });
  }
  connect();
  setInterval(function () { schedule(0); }, 10000);  // the slow fallback
})();
