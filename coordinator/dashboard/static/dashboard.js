// Live updates: one EventSource per page, fed by the dashboard process's single Redis
// subscription. On a change that concerns this page, the page's live region is
// re-rendered by the server (escaped there) and swapped in, from a read begun after the
// change (`since`); a slow refresh covers anything missed. The stream says every half
// second whether Redis answers: the dot turns red, "disconnected, last update N s ago",
// when it does not or when the stream itself goes quiet. No other script runs on these
// pages.
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
  var since = 0, lastUpdate = Date.now(), lastHeard = Date.now(), down = false;

  function roots() {
    var el = region.querySelector("[data-roots]");
    return el ? el.getAttribute("data-roots") : "";
  }
  function openStates() {  // what the operator opened or closed survives a refresh
    var states = {};
    region.querySelectorAll("details[data-id]").forEach(function (d) {
      states[d.getAttribute("data-id")] = d.open;
    });
    return states;
  }
  function show() {
    if (down) {
      var s = Math.round((Date.now() - lastUpdate) / 1000);
      dot.className = "live-state off";
      dot.textContent = "\u25cf disconnected, last update " + s + " s ago";
    } else {
      dot.className = "live-state on";
      dot.textContent = "\u25cf live";
    }
  }
  function connect() {
    watched = roots();
    if (source) { source.close(); }
    var url = base + "/api/live?view=" + encodeURIComponent(kind) +
      "&tenant=" + encodeURIComponent(tenant) + "&roots=" + encodeURIComponent(watched);
    source = new EventSource(url);
    // The server tells a new stream to refresh once after its first reading of the
    // page's trees: what changed before it is shown, every later change is reported.
    source.onerror = function () { down = true; show(); };
    source.onmessage = function (event) {
      var msg = {};
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      lastHeard = Date.now();
      if (msg.type === "status") {
        if (msg.redis && down) { schedule(0); }  // back: show what changed meanwhile
        down = !msg.redis;
        if (!down) { lastUpdate = Date.now(); }
        show();
        return;
      }
      if (msg.at && msg.at > since) { since = msg.at; }
      schedule(150);
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
    if (since) { url.searchParams.set("since", String(since)); }
    fetch(url.toString(), {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (html) {
        var states = openStates();
        region.innerHTML = html;
        region.querySelectorAll("details[data-id]").forEach(function (d) {
          var id = d.getAttribute("data-id");
          if (Object.prototype.hasOwnProperty.call(states, id)) { d.open = states[id]; }
        });
        body.setAttribute("data-refreshed", String(Date.now()));
        lastUpdate = Date.now();
        if (roots() !== watched) { connect(); }
      })
      .catch(function () { down = true; show(); })
      .then(function () {
        inflight = false;
        if (again) { again = false; schedule(0); }
      });
  }
  connect();
  setInterval(function () { schedule(0); }, 10000);  // the slow fallback
  setInterval(function () {  // a quiet stream (the dashboard gone) is a disconnection too
    if (Date.now() - lastHeard > 4000) { down = true; }
    show();
  }, 1000);
})();
