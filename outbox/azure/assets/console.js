"use strict";
(function () {
  const API = location.pathname.replace(/\/console\/?$/, "");
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
          "“more” searches further (a time range or a status narrows the search)"
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
      $("detail-payload").textContent = m.payload + (m.payload_truncated ? "\n…" : "");
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
