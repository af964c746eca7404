// gpuheal console: live updates. The server says, by server-sent events from the
// controller's caches, which version of the cluster it holds; when the page shows
// an older one, fetch the page's fragment again and swap it in. No inline script,
// no third-party code (Content-Security-Policy: script-src 'self').
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || document.body.dataset.session !== "yes") {
    return;
  }
  var fetching = false;
  var wanted = 0;

  function shown() {
    return Number(live.dataset.version || "0");
  }

  function refresh() {
    if (fetching) {
      return;
    }
    fetching = true;
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
        if (wanted > shown()) {
          refresh();
        }
      });
  }

  var source = new EventSource("/console/events");
  source.addEventListener("open", function () { document.body.dataset.live = "on"; });
  source.addEventListener("error", function () { document.body.dataset.live = "off"; });
  source.addEventListener("version", function (event) {
    document.body.dataset.live = "on";
    wanted = Number(event.data);
    if (wanted > shown()) {
      refresh();
    }
  });
})();
