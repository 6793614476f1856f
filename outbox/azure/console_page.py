"""The console's one page: HTML with its style and script inline (no asset from anywhere).

Everything shown came from a producer or a receiver (payloads, event types, errors): the script
puts it on the page as text only (``textContent``, never HTML), and the page's policy runs no
script but its own (a nonce per answer). The key is given once, in the address's fragment
(``#key=…``, which no server sees) or in the form; it is kept in the tab's ``sessionStorage``,
removed from the address at once (``history.replaceState``), and sent in the
``x-functions-key`` header of each call. Actions are POSTs; no cookie is ever set.
"""

from __future__ import annotations

NONCE = "__NONCE__"

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Outbox console</title>
<style nonce="__NONCE__">
body { font: 14px system-ui, sans-serif; margin: 0; color: #1b1f24; background: #f6f7f9; }
header { background: #1f2a37; color: #fff; padding: 8px 16px; display: flex; gap: 16px;
  align-items: center; }
header h1 { font-size: 16px; margin: 0; flex: 1; }
main { padding: 12px 16px; display: grid; gap: 12px; }
section { background: #fff; border: 1px solid #d8dde3; border-radius: 6px; padding: 10px 12px; }
h2 { font-size: 14px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #eef0f3;
  vertical-align: top; }
td.err, pre { white-space: pre-wrap; word-break: break-all; }
pre { background: #f3f4f6; padding: 8px; max-height: 320px; overflow: auto; margin: 0; }
.counts { display: flex; gap: 18px; flex-wrap: wrap; }
.count b { display: block; font-size: 20px; }
.row { display: flex; gap: 8px; flex-wrap: wrap; align-items: end; }
label { display: flex; flex-direction: column; font-size: 12px; gap: 2px; }
button { cursor: pointer; }
.notice { padding: 6px 8px; border-radius: 4px; background: #eef6ff; }
.notice.bad { background: #fdecec; }
.hidden { display: none; }
svg .delivered { stroke: #2f855a; fill: none; stroke-width: 1.5; }
svg .failed { stroke: #c53030; fill: none; stroke-width: 1.5; }
svg .axis { stroke: #cbd2d9; stroke-width: 1; }
a.link { color: #1a56db; cursor: pointer; text-decoration: underline; }
</style>
</head>
<body>
<header>
  <h1>Outbox console</h1>
  <span id="who"></span>
  <form id="key-form" class="row">
    <label>Key <input id="key-input" type="password" autocomplete="off"></label>
    <button type="submit">Use key</button>
  </form>
  <button id="forget" type="button">Forget key</button>
</header>
<main>
  <div id="notice" class="notice hidden" role="status"></div>
  <section id="overview">
    <h2>Overview <small id="refreshed"></small></h2>
    <div class="counts" id="counts"></div>
    <div id="chart"></div>
    <div class="row">
      <div><h2>Open breakers</h2><table id="breakers"></table></div>
      <div><h2>Paused endpoints</h2><table id="paused"></table></div>
      <div><h2>Held ordering keys</h2><table id="held"></table></div>
    </div>
    <h2>Failures by reason</h2>
    <table id="reasons"></table>
  </section>
  <section id="pause-section">
    <h2>Pause or resume an endpoint</h2>
    <form id="pause-form" class="row">
      <label>Endpoint <select id="pause-endpoint"></select></label>
      <button type="submit" id="pause-button">Pause</button>
      <button type="button" id="resume-button">Resume</button>
    </form>
  </section>
  <section id="messages-section">
    <h2>Messages</h2>
    <form id="filter" class="row">
      <label>Status <select name="status">
        <option value="">any</option><option>Pending</option><option>Processing</option>
        <option>Processed</option><option>Failed</option></select></label>
      <label>Event type <input name="event_type"></label>
      <label>Endpoint <input name="endpoint"></label>
      <label>Ordering key <input name="ordering_key"></label>
      <label>Created from <input name="created_from" placeholder="2026-01-02T14:00:00Z"></label>
      <label>Created to <input name="created_to" placeholder="2026-01-02T15:00:00Z"></label>
      <label>Error text <input name="error"></label>
      <button type="submit" id="search">Search</button>
      <button type="button" id="requeue-plan">Requeue matching Failed…</button>
    </form>
    <div id="plan" class="notice hidden">
      <span id="plan-text"></span>
      <button type="button" id="requeue-run" data-batch="500">Requeue them</button>
      <button type="button" id="requeue-cancel">Cancel</button>
    </div>
    <table id="messages"></table>
    <button type="button" id="more" class="hidden">Next page</button>
    <p id="scan-limited"></p>
  </section>
  <section id="detail" class="hidden">
    <h2>Message <span id="detail-id"></span></h2>
    <table id="detail-facts"></table>
    <form id="resend-form" class="row hidden">
      <label>Send again to <select id="resend-endpoint"></select></label>
      <button type="submit" id="resend-button">Resend</button>
    </form>
    <h2>Endpoints</h2>
    <table id="detail-endpoints"></table>
    <h2>Attempts</h2>
    <table id="detail-attempts"></table>
    <h2>Payload</h2>
    <pre id="detail-payload"></pre>
  </section>
  <section>
    <h2>Actions taken</h2>
    <table id="actions"></table>
  </section>
</main>
<script nonce="__NONCE__">
"use strict";
(function () {
  const API = location.pathname.replace(/\\/console\\/?$/, "");
  const STORE = "outboxConsoleKey";
  const $ = (id) => document.getElementById(id);
  let key = sessionStorage.getItem(STORE) || "";
  let filter = {};
  let nextCursor = null;
  let plan = null;
  let configured = {};
  let shownMessage = null;

  function takeKeyFromAddress() {
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    const query = new URLSearchParams(location.search);
    const given = fragment.get("key") || query.get("code");
    if (given) { key = given; sessionStorage.setItem(STORE, key); }
    if (location.hash || location.search) {
      history.replaceState(null, "", location.pathname);
    }
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function notice(text, bad) {
    const box = $("notice");
    box.textContent = text;
    box.className = "notice" + (bad ? " bad" : "");
  }

  async function call(method, path, body) {
    const options = { method: method, headers: { "x-functions-key": key },
                      credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      options.headers["content-type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(API + path, options);
    let data = {};
    try { data = await response.json(); } catch (e) { data = {}; }
    if (!response.ok) {
      const reason = typeof data.error === "string" ? data.error : "HTTP " + response.status;
      const error = new Error(response.status === 401 || response.status === 403
        ? "refused (" + response.status + "): this key may not do that: " + reason
        : reason);
      error.status = response.status;
      throw error;
    }
    return data;
  }

  function fill(table, headings, rows) {
    table.replaceChildren();
    const head = el("tr");
    headings.forEach((h) => head.appendChild(el("th", h)));
    table.appendChild(head);
    rows.forEach((cells) => {
      const tr = el("tr");
      cells.forEach((cell) => {
        if (cell instanceof Node) { const td = el("td"); td.appendChild(cell); tr.appendChild(td); }
        else tr.appendChild(el("td", cell === null || cell === undefined ? "" : cell,
                                typeof cell === "string" && cell.length > 40 ? "err" : ""));
      });
      table.appendChild(tr);
    });
    if (!rows.length) {
      const tr = el("tr"); const td = el("td", "none"); td.colSpan = headings.length;
      tr.appendChild(td); table.appendChild(tr);
    }
  }

  function link(text, onClick) {
    const a = el("a", text, "link");
    a.setAttribute("role", "button");
    a.tabIndex = 0;
    a.addEventListener("click", onClick);
    return a;
  }

  function chart(rates) {
    const NS = "http://www.w3.org/2000/svg";
    const width = 600, height = 90;
    const top = Math.max(1, ...rates.map((r) => Math.max(r.delivered, r.failed)));
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", "0 0 " + width + " " + (height + 14));
    svg.setAttribute("width", String(width));
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "deliveries and failures per minute, last hour");
    const axis = document.createElementNS(NS, "line");
    [["x1", 0], ["y1", height], ["x2", width], ["y2", height]].forEach(
      ([n, v]) => axis.setAttribute(n, String(v)));
    axis.setAttribute("class", "axis");
    svg.appendChild(axis);
    ["delivered", "failed"].forEach((series) => {
      const line = document.createElementNS(NS, "polyline");
      const step = width / Math.max(1, rates.length - 1);
      line.setAttribute("points", rates.map((r, i) =>
        (i * step).toFixed(1) + "," + (height - (r[series] / top) * (height - 4)).toFixed(1)
      ).join(" "));
      line.setAttribute("class", series);
      svg.appendChild(line);
    });
    const caption = document.createElementNS(NS, "text");
    caption.setAttribute("x", "0"); caption.setAttribute("y", String(height + 12));
    caption.setAttribute("font-size", "10");
    const total = (s) => rates.reduce((n, r) => n + r[s], 0);
    caption.textContent = "last hour, per minute (max " + top + "): delivered " +
      total("delivered") + " (green), failed " + total("failed") + " (red)";
    svg.appendChild(caption);
    $("chart").replaceChildren(svg);
  }

  function showOverview(data) {
    const counts = $("counts");
    counts.replaceChildren();
    const estimated = data.estimated_counts || [];
    Object.entries(data.counts).forEach(([status, n]) => {
      const box = el("div", null, "count");
      box.id = "count-" + status;
      const guess = estimated.includes(status);
      const figure = el("b", (guess ? "~" : "") + n);
      if (guess) figure.title = "an estimate: too many rows to count at each refresh";
      box.appendChild(figure);
      box.appendChild(document.createTextNode(guess ? status + " (estimate)" : status));
      counts.appendChild(box);
    });
    const age = data.oldest_unpublished_age_seconds;
    const oldest = el("div", null, "count");
    oldest.id = "oldest";
    oldest.appendChild(el("b", age === null ? "none" : age + " s"));
    oldest.appendChild(document.createTextNode("oldest unpublished"));
    counts.appendChild(oldest);
    chart(data.rates);
    fill($("breakers"), ["event type", "endpoint", "failures", "next probe"],
      data.open_breakers.map((b) => [b.event_type, b.endpoint, b.consecutive_failures,
                                      b.next_probe]));
    fill($("paused"), ["event type", "endpoint", "since", "by"],
      data.paused_endpoints.map((p) => [p.event_type, p.endpoint, p.since, p.by]));
    fill($("held"), ["ordering key", "held"], data.held_keys.map((h) => [h.ordering_key, h.held]));
    fill($("reasons"), ["reason", "messages", "event types", ""],
      data.failure_reasons.map((r) => [r.reason, r.messages, r.event_types.join(", "),
        link("list", () => { setFilter({ status: "Failed", error: r.reason }); })]));
    configured = data.endpoints;
    const select = $("pause-endpoint");
    const chosen = select.value;
    select.replaceChildren();
    Object.entries(data.endpoints).forEach(([eventType, names]) => {
      names.forEach((name) => {
        const option = el("option", eventType + " → " + name);
        option.value = JSON.stringify([eventType, name]);
        select.appendChild(option);
      });
    });
    if (chosen) select.value = chosen;
    $("refreshed").textContent = "(refreshed " + new Date().toLocaleTimeString() + ")";
  }

  async function refresh() {
    if (!key) { notice("Give a key to read the outbox.", true); return; }
    try {
      showOverview(await call("GET", "/overview"));
      const listed = await call("GET", "/actions");
      fill($("actions"), ["when", "action", "filter", "rows", "key"],
        listed.actions.map((a) => [a.created_at, a.action, JSON.stringify(a.filter),
                                   a.affected, a.actor]));
    } catch (e) { notice(e.message, true); }
  }

  function setFilter(values) {
    const form = $("filter");
    Array.from(form.elements).forEach((input) => {
      if (input.name) input.value = values[input.name] || "";
    });
    search();
  }

  function readFilter() {
    const values = {};
    Array.from($("filter").elements).forEach((input) => {
      if (input.name && input.value.trim()) values[input.name] = input.value.trim();
    });
    return values;
  }

  async function search(more) {
    if (!more) { filter = readFilter(); nextCursor = null; }
    const params = new URLSearchParams(filter);
    if (more && nextCursor) params.set("after", nextCursor);
    try {
      const page = await call("GET", "/messages?" + params.toString());
      const rows = page.messages.map((m) => [
        link(m.outbox_message_id, () => detail(m.outbox_message_id)),
        m.event_type, m.status, m.attempt_count, m.created_at, m.ordering_key, m.last_error]);
      const table = $("messages");
      if (more) {
        const holder = el("table");
        fill(holder, [], rows);
        Array.from(holder.querySelectorAll("tr")).slice(1).forEach((tr) => table.appendChild(tr));
      } else {
        fill(table, ["id", "event type", "status", "attempts", "created", "ordering key",
                     "last error"], rows);
      }
      nextCursor = page.next;
      $("more").className = page.next ? "" : "hidden";
      $("scan-limited").textContent = page.scan_limited
        ? "searched the latest " + page.scan_limit + " messages of this page's range: " +
          "\u201cmore\u201d searches further (a time range or a status narrows the search)"
        : "";
    } catch (e) { notice(e.message, true); }
  }

  async function detail(id) {
    try {
      const m = await call("GET", "/messages/" + encodeURIComponent(id));
      $("detail").className = "";
      $("detail-id").textContent = m.outbox_message_id;
      fill($("detail-facts"), ["field", "value"], [
        ["event type", m.event_type], ["status", m.status], ["attempts", m.attempt_count],
        ["created", m.created_at], ["finished", m.finished_at],
        ["next attempt", m.next_attempt_at], ["ordering key", m.ordering_key],
        ["trace id", m.trace_id], ["last error", m.last_error]]);
      fill($("detail-endpoints"), ["endpoint", "status", "attempts", "last error"],
        m.endpoints.map((e) => [e.endpoint, e.status, e.attempts, e.last_error]));
      fill($("detail-attempts"), ["#", "endpoint", "outcome", "started", "duration ms", "HTTP",
                                  "error", "resend"],
        m.attempts.map((a) => [a.attempt_number, a.endpoint, a.outcome, a.started_at,
                               a.duration_ms, a.http_status, a.error,
                               a.resend ? "resend" : ""]));
      shownMessage = m;
      const target = $("resend-endpoint");
      target.replaceChildren(el("option", "every endpoint"));
      target.firstChild.value = "";
      (configured[m.event_type] || []).forEach((name) => {
        const option = el("option", name);
        option.value = name;
        target.appendChild(option);
      });
      $("resend-form").className = m.status === "Processed" ? "row" : "row hidden";
      $("detail-payload").textContent = m.payload + (m.payload_truncated ? "\\n…" : "");
      $("detail").scrollIntoView();
    } catch (e) { notice(e.message, true); }
  }

  function requeueBody(values) {
    if (values.status && values.status !== "Failed") {
      throw new Error("only Failed messages can be requeued: set the status filter to Failed");
    }
    if (values.ordering_key) throw new Error("requeue does not filter by ordering key");
    const body = {};
    ["event_type", "endpoint", "created_from", "created_to", "error"].forEach((name) => {
      if (values[name]) body[name] = values[name];
    });
    if (!Object.keys(body).length) body.all_failed = true;
    return body;
  }

  async function planRequeue() {
    try {
      const body = requeueBody(readFilter());
      const dry = await call("POST", "/requeue", Object.assign({ dry_run: true }, body));
      plan = { body: body, actionId: crypto.randomUUID(), total: dry.requeued };
      $("plan-text").textContent = "Dry run: " + dry.requeued +
        " Failed message(s) match; they go again to: " + (dry.endpoints || []).join(", ");
      $("plan").className = "notice";
    } catch (e) { notice(e.message, true); }
  }

  // One batch per call under the plan's action id, until the requeue is done: the progress shows
  // after each. A failed call stops the loop; "Requeue them" again goes on where it stopped (the
  // same action id: no row is requeued twice).
  let requeueing = false;
  async function runRequeue() {
    if (!plan || requeueing) return;
    requeueing = true;
    const size = Number($("requeue-run").dataset.batch);
    try {
      let step = { done: false, requeued: 0 };
      while (!step.done) {
        step = await call("POST", "/requeue",
          Object.assign({ action_id: plan.actionId, batch_size: size }, plan.body));
        if (step.in_progress) throw new Error("this requeue is running elsewhere: try again");
        $("plan-text").textContent = "Requeued " + step.requeued + " of " + plan.total + "…";
      }
      notice("Requeued " + step.requeued + " of " + plan.total + " message(s)");
      $("plan").className = "notice hidden";
      plan = null;
      refresh(); search();
    } catch (e) {
      notice(e.message + " (Requeue them again goes on where it stopped)", true);
    } finally { requeueing = false; }
  }

  async function resend() {
    if (!shownMessage) return;
    const body = { message_ids: [shownMessage.outbox_message_id],
                   action_id: crypto.randomUUID() };
    if ($("resend-endpoint").value) body.endpoint = $("resend-endpoint").value;
    try {
      const done = await call("POST", "/resend", body);
      notice("Resent " + done.resent.length + " message(s)" +
             (done.skipped.length ? "; not Processed, left as they are: " +
              done.skipped.join(", ") : ""));
      refresh();
    } catch (e) { notice(e.message, true); }
  }

  async function pauseOrResume(what) {
    const chosen = $("pause-endpoint").value;
    if (!chosen) return;
    const [eventType, endpoint] = JSON.parse(chosen);
    try {
      await call("POST", "/" + what, { event_type: eventType, endpoint: endpoint,
                                       action_id: crypto.randomUUID() });
      notice((what === "pause" ? "Paused " : "Resumed ") + endpoint + " of " + eventType);
      refresh();
    } catch (e) { notice(e.message, true); }
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    key = $("key-input").value;
    $("key-input").value = "";
    sessionStorage.setItem(STORE, key);
    refresh(); search();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(STORE); key = ""; notice("Key forgotten.", false);
  });
  $("filter").addEventListener("submit", (event) => { event.preventDefault(); search(); });
  $("more").addEventListener("click", () => search(true));
  $("requeue-plan").addEventListener("click", planRequeue);
  $("requeue-run").addEventListener("click", runRequeue);
  $("requeue-cancel").addEventListener("click", () => {
    plan = null; $("plan").className = "notice hidden";
  });
  $("pause-form").addEventListener("submit", (event) => {
    event.preventDefault(); pauseOrResume("pause");
  });
  $("resume-button").addEventListener("click", () => pauseOrResume("resume"));
  $("resend-form").addEventListener("submit", (event) => { event.preventDefault(); resend(); });

  takeKeyFromAddress();
  refresh();
  if (key) search();
  setInterval(refresh, 10000);
})();
</script>
</body>
</html>
"""


def render(nonce: str) -> str:
    """The page, its inline script and style carrying ``nonce``."""
    return PAGE.replace(NONCE, nonce)
