// Filters for the compatibility grid: each <select class="filter" data-key=K> keeps the rows
// (and plot figures) whose data-K attribute lists the chosen value; "" keeps everything.
(function () {
  "use strict";
  var selects = Array.prototype.slice.call(document.querySelectorAll("select.filter"));
  var items = Array.prototype.slice.call(document.querySelectorAll("[data-filtered]"));
  var count = document.getElementById("visible-count");
  function apply() {
    var shownRows = 0, rows = 0;
    items.forEach(function (el) {
      var keep = selects.every(function (s) {
        var want = s.value;
        var have = (el.getAttribute("data-" + s.getAttribute("data-key")) || "").split(" ");
        return want === "" || have.indexOf(want) !== -1;
      });
      el.hidden = !keep;
      if (el.tagName === "TR") { rows += 1; if (keep) { shownRows += 1; } }
    });
    count.textContent = shownRows + " of " + rows + " combinations shown";
  }
  selects.forEach(function (s) { s.addEventListener("change", apply); });
  apply();
})();
