// gpuheal console: live updates. The server says, by server-sent events from the
// controller's caches, which version of the cluster it holds ("epoch.counter");
// when the page shows another, fetch the page's fragment again and swap it in.
// No inline script, no third-party code (Content-Security-Policy: script-src 'self').
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || document.body.dataset.session !== "yes") {
    return;
  }
  var fetching = false;
  var dirty = false; // an event came that the page may not show yet

  function refresh() {
    if (fetching) {
      return;
    }
    fetching = true;
    dirty = false;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (response.status === 401) {
          window.location.assign("/console/login");
          throw new Error("signed out");
        }
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        // Parsed, never executed: DOMParser runs no script, and the CSP forbids inline ones.
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        if (fresh) {
          live.replaceWith(document.adoptNode(fresh));
          live = fresh;
        }
      })
      .catch(function () { /* the next event tries again */ })
      .finally(function () {
        fetching = false;
        // Only news that came during the fetch asks again: behind a Service, the
        // stream and the fetch may reach different replicas, whose versions differ.
        if (dirty) {
          refresh();
        }
      });
  }

  var source = new EventSource("/console/events");
  source.addEventListener("open", function () { document.body.dataset.live = "on"; });
  source.addEventListener("error", function () { document.body.dataset.live = "off"; });
  source.addEventListener("version", function (event) {
    document.body.dataset.live = "on";
    if (event.data !== live.dataset.version) {
      dirty = true;
      refresh();
    }
  });
})();
