// The picker: the best combination for the chosen Python, CUDA or driver, GPU and use.
// The ranking is the lockfile's (query.answer, embedded per GPU and use); this only drops
// what the choices rule out and says why. Then the grid's filters: each
// <select class="filter" data-key=K> keeps the rows (and plot figures) whose data-K
// attribute lists the chosen value; "" keeps everything. The picker sets the grid's
// filters to its own choices, so the grid below shows what the answer was chosen from.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("picker-data").textContent);
  var INSTALLABLE = { "verified": true, "verified-with-workaround": true };

  function $(id) { return document.getElementById(id); }
  function driverParts(text) {
    var parts = text.trim().split(".").map(function (p) { return parseInt(p, 10); });
    while (parts.length < 3) { parts.push(0); }
    return parts;
  }
  function driverAtLeast(have, need) {
    var a = driverParts(have), b = driverParts(need);
    for (var i = 0; i < 3; i += 1) {
      if (a[i] !== b[i]) { return a[i] > b[i]; }
    }
    return true;
  }
  function ruledOut(entry, choice) {
    var why = [];
    if (choice.python && entry.python !== choice.python) {
      why.push("Python " + entry.python);
    }
    if (choice.cuda && entry.cuda !== choice.cuda) {
      why.push(entry.cuda ? "CUDA " + entry.cuda : "no CUDA");
    }
    if (choice.driver && entry.driver && !driverAtLeast(choice.driver, entry.driver)) {
      why.push("needs driver ≥ " + entry.driver);
    }
    if (choice.arch && entry.arch !== choice.arch) {
      why.push("built for " + entry.arch);
    }
    return why;
  }
  function text(id, value) { $(id).textContent = value; }
  var USES = ["inference", "inference-compiled", "training", "training-compiled"];

  // the rows of data.ranked[gpu|use] that the choices leave, with counts of the rest
  function fitting(gpu, use, choice) {
    var ranked = data.ranked[gpu + "|" + use] || [];
    var fits = [], out = 0, lockless = 0, reasons = {};
    ranked.forEach(function (row) {
      var entry = data.entries[row[0]];
      var why = ruledOut(entry, choice);
      why.forEach(function (w) { reasons[w] = (reasons[w] || 0) + 1; });
      if (why.length) { out += 1; }
      else if (!entry.installable) { lockless += 1; }
      else { fits.push(row); }
    });
    return { fits: fits, out: out, lockless: lockless, reasons: reasons };
  }

  function perUse(gpu, choice) {
    var list = $("answer-uses");
    if (!list) { return; }
    list.innerHTML = "";
    USES.forEach(function (use) {
      var best = fitting(gpu, use, choice).fits[0];
      var li = document.createElement("li");
      li.setAttribute("data-use", use);
      li.innerHTML = '<span class="use-name"></span> <span class="verdict-badge"></span> <span class="uid"></span>';
      li.querySelector(".use-name").textContent = use;
      var badge = li.querySelector(".verdict-badge");
      badge.className = "verdict-badge v-" + (best ? best[1] : "unsatisfiable");
      badge.textContent = best ? best[1] : "nothing fits";
      li.querySelector(".uid").textContent = best ? best[0] : "";
      list.appendChild(li);
    });
  }

  // the grid's filters follow the picker: Python, CUDA (as its tag), GPU and use
  function followGrid(choice, gpu, use) {
    var wanted = {
      python: choice.python,
      cuda: choice.cuda ? "cu" + choice.cuda.replace(".", "") : "",
      gpu: gpu ? "sm_" + gpu.replace(".", "") : "",
      uses: use
    };
    Object.keys(wanted).forEach(function (key) {
      var select = $("filter-" + key);
      if (!select) { return; }
      var has = Array.prototype.some.call(select.options, function (o) { return o.value === wanted[key]; });
      select.value = has ? wanted[key] : "";
    });
    if (typeof applyFilters === "function") { applyFilters(); }
  }
  var applyFilters = null;

  function pick() {
    var gpu = $("pick-gpu");
    var option = gpu.options[gpu.selectedIndex];
    var driver = $("pick-driver").value.trim();
    var validDriver = /^\d+(\.\d+){0,2}$/.test(driver);
    var choice = {
      python: $("pick-python").value,
      cuda: $("pick-cuda").value,
      driver: validDriver ? driver : "",
      arch: option ? option.getAttribute("data-arch") || "" : ""
    };
    // a combination without a lock (unsatisfiable, a resolver error) installs nothing
    var found = fitting(gpu.value, $("pick-use").value, choice);
    var fits = found.fits, out = found.out, lockless = found.lockless, reasons = found.reasons;
    perUse(gpu.value, choice);
    followGrid(choice, gpu.value, $("pick-use").value);
    var answer = $("answer");
    if (!fits.length) {
      answer.innerHTML = '<p class="answer-head"><span id="answer-verdict" class="verdict-badge v-unsatisfiable">nothing fits</span> <span id="answer-id"></span></p>' +
        '<p id="answer-why" class="reason"></p><p id="answer-more" class="meta"></p>';
      var common = Object.keys(reasons).sort(function (a, b) { return reasons[b] - reasons[a]; });
      text("answer-why", "No installable combination in this lockfile fits these choices (" +
        out + " ruled out" + (lockless ? ", " + lockless + " without a lock" : "") + ")" +
        (common.length ? ": " + common.slice(0, 3).map(function (w) {
          return w + " (" + reasons[w] + ")";
        }).join(", ") : "") + ".");
      return;
    }
    var best = fits[0];
    var entry = data.entries[best[0]];
    var verdict = best[1];
    var use = $("pick-use").value;
    var command = "envbuilder install " + best[0] + (use ? " --use " + use : "");
    var installable = INSTALLABLE[verdict] && entry.installable;
    answer.innerHTML = '<p class="answer-head"><span id="answer-verdict" class="verdict-badge"></span> <span id="answer-id"></span></p>' +
      (installable ? '<code class="cmd" id="answer-cmd"></code>'
        : '<p class="answer-none">Nothing verified for these choices: no install command to recommend.</p>') +
      '<p id="answer-why" class="reason"></p><p id="answer-more" class="meta"></p>';
    $("answer-verdict").className = "verdict-badge v-" + verdict;
    text("answer-verdict", verdict);
    text("answer-id", best[0]);
    if (installable) { text("answer-cmd", command); }
    text("step-install", installable ? command : "envbuilder query --here");
    text("answer-why", data.reasons[best[2]]);
    var more = (fits.length - 1) + " more fit" + (out ? ", " + out + " ruled out by your choices" : "") +
      (lockless ? ", " + lockless + " without a lock" : "");
    if (driver && !validDriver) { more += "; driver ignored: give it like 550.54.15"; }
    text("answer-more", more);
  }
  ["pick-python", "pick-cuda", "pick-gpu", "pick-use"].forEach(function (id) {
    $(id).addEventListener("change", pick);
  });
  $("pick-driver").addEventListener("input", pick);
  var lockUrl = new URL("compat.lock.json", window.location.href).href;
  if ($("step-lock")) { text("step-lock", "--lock " + lockUrl); }

  var selects = Array.prototype.slice.call(document.querySelectorAll("select.filter"));
  var items = Array.prototype.slice.call(document.querySelectorAll("[data-filtered]"));
  var count = $("visible-count");
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
  applyFilters = apply;
  pick();
})();
