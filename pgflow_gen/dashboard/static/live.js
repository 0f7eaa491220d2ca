// pgflow-gen dashboard: confirmations before actions, and a run's page that follows the run.
// No framework and nothing fetched from elsewhere: the page works without this file, which
// only adds the live updates (Server-Sent Events from /runs/<id>/events).
(function () {
  "use strict";

  var leaving = false;  // a form was sent: the page the server answers with replaces this one

  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    } else {
      leaving = true;
    }
  });

  var live = document.getElementById("live");
  if (!live || live.dataset.active !== "yes" || !window.EventSource) {
    return;
  }
  var run = live.dataset.run;
  var busy = false;
  var again = false;

  // An operator at a form of the run (typing a reason or a signal's payload, or pressing its
  // button) keeps it: a refresh waits until the focus leaves the form, and puts typed values
  // back. Redrawing a button between the press and the release would swallow the click.
  // data-held says a refresh is waiting.
  function atForm() {
    var active = document.activeElement;
    return Boolean(active && live.contains(active) && active.closest("form"));
  }

  function hold() {
    again = true;
    live.dataset.held = "yes";
  }

  function typed() {
    var kept = {};
    live.querySelectorAll("form input:not([type=hidden])").forEach(function (input) {
      if (input.value) {
        kept[input.form.getAttribute("action") + "|" + input.name] = input.value;
      }
    });
    return kept;
  }

  function restore(kept) {
    live.querySelectorAll("form input:not([type=hidden])").forEach(function (input) {
      var value = kept[input.form.getAttribute("action") + "|" + input.name];
      if (value !== undefined) {
        input.value = value;
      }
    });
  }

  live.addEventListener("focusout", function (event) {
    var next = event.relatedTarget;
    if (next && live.contains(next) && next.closest("form")) {
      return;  // from one field of the run's forms to another, or to its button
    }
    if (again && !busy) {
      again = false;
      refresh();
    }
  });

  function refresh() {
    if (leaving) {
      return;
    }
    if (busy) {
      again = true;
      return;
    }
    if (atForm()) {
      hold();
      return;
    }
    busy = true;
    fetch("/runs/" + run + "?fragment=1", { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html !== null && !atForm() && !leaving) {
          var kept = typed();
          live.innerHTML = html;
          restore(kept);
          live.dataset.held = "no";
          live.dataset.refreshes = String(Number(live.dataset.refreshes || 0) + 1);
        } else if (html !== null) {
          hold();
        }
      })
      .catch(function () { /* the next event tries again */ })
      .finally(function () {
        busy = false;
        if (again && !atForm()) {
          again = false;
          refresh();
        }
      });
  }

  var source = new EventSource("/runs/" + run + "/events");
  // The server says "ready" once it listens for this run (again after losing the database):
  // reading the run then catches what happened before, and the messages bring what follows.
  source.addEventListener("ready", refresh);
  source.onmessage = function (message) {
    refresh();
    var event = null;
    try {
      event = JSON.parse(message.data).event;
    } catch (ignored) { /* not one of the engine's events */ }
    if (event === "run:completed" || event === "run:failed" || event === "run:cancelled") {
      source.close();
      live.dataset.active = "no";
    }
  };
})();
