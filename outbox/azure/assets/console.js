"use strict";
// The operator's console. Everything it shows came from a producer, a receiver or the API: it is
// put on the page as text (textContent), never as HTML. The key comes from the address's fragment
// (#key=…, which no server sees) or the form, stays in this tab's sessionStorage and goes only in
// the x-functions-key header.
(function () {
  const API = location.pathname.replace(/\/console\/?$/, "");
  const STORE = "outboxConsoleKey";
  const REFRESH_MS = 10000;
  const $ = (id) => document.getElementById(id);

  // Stale answers: each key (and "Forget key") starts a new generation, and an answer to a call
  // made under an earlier one is dropped, so nothing read with a forgotten key comes back.
  class Stale extends Error {}

  const state = {
    key: sessionStorage.getItem(STORE) || "",
    generation: 0,
    canAct: false,
    view: "overview",
    configured: {},
    errorFrom: null,
    busy: new Set(),
    list: { filter: {}, next: null, pages: 0, selected: new Set() },
    message: null,
    messageId: null,
    audit: { filter: {}, next: null, page: 1 },
    requeue: null,
    replay: null,
  };

  // ---- Times: one zone (UTC), to the minute; the exact value in the title. ----

  function parseTime(iso) {
    if (iso === null || iso === undefined || iso === "") return null;
    const text = String(iso).replace(/(\.\d{3})\d+/, "$1");
    const date = new Date(/(Z|[+-]\d\d:?\d\d)$/.test(text) ? text : text + "Z");
    return isNaN(date.getTime()) ? null : date;
  }

  function isNever(iso) { return /^(9999-|infinity)/.test(String(iso)); }

  function utc(iso) {
    if (iso === null || iso === undefined || iso === "") return "";
    if (isNever(iso)) return "never";
    const date = parseTime(iso);
    return date ? date.toISOString().slice(0, 16).replace("T", " ") + " UTC" : String(iso);
  }

  // 125 → "2 min 5 s", 7500 → "2 h 5 min": the two largest units.
  function age(seconds) {
    if (seconds === null || seconds === undefined) return "";
    let left = Math.round(Math.abs(Number(seconds)));
    if (left < 60) return left + " s";
    const parts = [];
    for (const [name, size] of [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]]) {
      const n = Math.floor(left / size);
      left -= n * size;
      if (n || parts.length) parts.push([n, name]);
      if (parts.length === 2) break;
    }
    return parts.filter(([n]) => n).map(([n, name]) => n + " " + name).join(" ");
  }

  function relative(iso) {
    const date = parseTime(iso);
    if (!date || isNever(iso)) return "";
    const seconds = (Date.now() - date.getTime()) / 1000;
    if (Math.abs(seconds) < 1) return "now";
    return seconds > 0 ? age(seconds) + " ago" : "in " + age(seconds);
  }

  function time(iso, withRelative) {
    const node = el("time", utc(iso));
    if (iso && !isNever(iso)) {
      node.dateTime = String(iso);
      node.title = String(iso);
      const from = withRelative ? relative(iso) : "";
      if (from) node.textContent += " (" + from + ")";
    }
    return node;
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "";
    return ms < 1000 ? Math.round(ms) + " ms" : (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  }

  // A time typed as "2026-01-02 14:00" is UTC; one with an offset is taken as given.
  function isoFromTyped(text) {
    const typed = text.trim();
    const match = /^(\d{4}-\d\d-\d\d)(?:[ T](\d\d:\d\d)(:\d\d(?:\.\d+)?)?)?$/.exec(typed);
    if (!match) return typed;
    return match[1] + "T" + (match[2] || "00:00") + (match[3] || ":00") + "Z";
  }

  // ---- Building the page from data, as text only. ----

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function button(text, onClick, cls) {
    const node = el("button", text, cls);
    node.type = "button";
    node.addEventListener("click", onClick);
    return node;
  }

  function link(text, onClick) {
    const a = el("a", text, "link");
    a.setAttribute("role", "button");
    a.tabIndex = 0;
    a.addEventListener("click", onClick);
    a.addEventListener("keydown", (event) => { if (event.key === "Enter") onClick(); });
    return a;
  }

  function messageLink(id) { return link(id, () => openMessage(id)); }

  function cellOf(value) {
    if (value instanceof Node) { const td = el("td"); td.appendChild(value); return td; }
    const text = value === null || value === undefined ? "" : String(value);
    return el("td", text, text.length > 40 ? "long" : "");
  }

  function fill(table, headings, rows) {
    table.replaceChildren();
    const head = el("tr");
    headings.forEach((h) => head.appendChild(el("th", h)));
    table.appendChild(head);
    rows.forEach((cells) => table.appendChild(tableRow(cells)));
    if (!rows.length) {
      const tr = el("tr"); const td = el("td", "none"); td.colSpan = headings.length;
      tr.appendChild(td); table.appendChild(tr);
    }
  }

  function tableRow(cells) {
    const tr = el("tr");
    cells.forEach((cell) => tr.appendChild(cellOf(cell)));
    return tr;
  }

  function nodes(...parts) {
    const span = el("span");
    parts.forEach((p) => span.appendChild(p instanceof Node ? p : document.createTextNode(p)));
    return span;
  }

  function plural(n, one, many) { return n + " " + (n === 1 ? one : many || one + "s"); }

  // ---- Notices: an error stays until the part of the page it came from next succeeds. ----

  function say(text) {
    $("notice-text").textContent = text;
    $("notice").className = "notice";
    state.errorFrom = null;
  }

  function fail(source, error) {
    if (error instanceof Stale) return;
    $("notice-text").textContent = error.message;
    $("notice").className = "notice bad";
    state.errorFrom = source;
  }

  function succeeded(source) {
    if (state.errorFrom === source) clearNotice();
  }

  function clearNotice() {
    $("notice-text").textContent = "";
    $("notice").className = "notice hidden";
    state.errorFrom = null;
  }

  // ---- The API: the key in a header, never in an address; no cookie. ----

  async function request(method, path, body) {
    const generation = state.generation;
    const options = { method: method, headers: { "x-functions-key": state.key },
                      credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      options.headers["content-type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    let response;
    for (let tries = 1; ; tries++) {
      try { response = await fetch(API + path, options); break; } catch (e) {
        // An action carries its action_id: sent again after a lost answer, it does not act
        // twice. A read is simply read again at the next refresh.
        if (tries >= 3 || !(body && body.action_id)) throw new Error("no answer: " + e.message);
      }
    }
    if (generation !== state.generation) throw new Stale("answer to a forgotten key");
    if (!response.ok) throw await failure(response);
    return response;
  }

  async function failure(response) {
    let data = {};
    try { data = await response.json(); } catch (e) { data = {}; }
    const reason = typeof data.error === "string" ? data.error : "HTTP " + response.status;
    const error = new Error(response.status === 401 || response.status === 403
      ? "refused (" + response.status + "): this key may not do that: " + reason
      : reason);
    error.status = response.status;
    return error;
  }

  async function call(method, path, body) {
    const response = await request(method, path, body);
    const data = await response.json();
    return data;
  }

  function act(path, body) {
    return call("POST", path, Object.assign({ action_id: crypto.randomUUID() }, body));
  }

  async function once(name, work) {
    if (state.busy.has(name)) return;
    state.busy.add(name);
    try { await work(); } finally { state.busy.delete(name); }
  }

  // A part of the page shows the answer to its latest read only (an older answer arriving late
  // is dropped); the periodic refresh skips a part whose read is still under way. An error
  // shown is cleared by the next success of the same part (errorSource: the operator's own
  // lookups apart from refreshes, so a refresh does not hide a lookup's error).
  const reads = {};
  const reading = {};
  async function read(source, path, showIt, errorSource) {
    const asked = (reads[source] = (reads[source] || 0) + 1);
    reading[source] = (reading[source] || 0) + 1;
    try {
      const data = await call("GET", path);
      if (reads[source] !== asked) return false;
      showIt(data);
      succeeded(source);
      if (errorSource) succeeded(errorSource);
      return true;
    } catch (e) {
      if (reads[source] === asked) fail(errorSource || source, e);
      return false;
    } finally { reading[source] -= 1; }
  }

  function idle(source) { return !reading[source]; }

  // ---- Confirmation: every state change names what will happen, to how many, first. ----

  function confirmDialog(title, text, confirmLabel, askReason) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = confirmLabel;
    $("confirm-reason").value = "";
    $("confirm-problem").textContent = "";
    $("confirm-reason-label").className = askReason ? "" : "hidden";
    return new Promise((resolve) => {
      const finish = (answer) => {
        $("confirm-ok").onclick = null;
        $("confirm-cancel").onclick = null;
        dialog.oncancel = null;
        dialog.close();
        ["confirm-title", "confirm-text", "confirm-ok", "confirm-problem"].forEach(
          (id) => { $(id).textContent = ""; });
        $("confirm-reason").value = "";
        resolve(answer);
      };
      $("confirm-ok").onclick = () => {
        const reason = $("confirm-reason").value.trim();
        if (askReason && !reason) {
          $("confirm-problem").textContent = "Give a reason: it is recorded with the action.";
          return;
        }
        finish({ reason: reason });
      };
      $("confirm-cancel").onclick = () => finish(null);
      dialog.oncancel = (event) => { event.preventDefault(); finish(null); };
      dialog.showModal();
      (askReason ? $("confirm-reason") : $("confirm-cancel")).focus();
    });
  }

  // ---- Health and overview. ----

  function showHealth(health) {
    $("health").className = "health " + (health.healthy ? "healthy" : "unhealthy");
    $("health-state").textContent = health.healthy ? "Healthy" : "Unhealthy";
    $("health-why").textContent = (health.problems || []).join("; ");
    const oldest = health.oldest_unpublished_age_seconds;
    const facts = [oldest === null || oldest === undefined
      ? "nothing unpublished" : "oldest unpublished message " + age(oldest) + " old"];
    if (typeof health.alert_threshold_seconds === "number") {
      facts.push("alert beyond " + age(health.alert_threshold_seconds));
    }
    if (health.held_back) {
      facts.push(plural(health.held_back, "message") + " held back behind an earlier one " +
                 "of their ordering key");
    }
    $("health-age").textContent = facts.join(" · ");
  }

  function healthUnknown(text) {
    $("health").className = "health unknown";
    $("health-state").textContent = text;
    $("health-why").textContent = "";
    $("health-age").textContent = "";
  }

  function showCounts(data) {
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
      box.appendChild(document.createTextNode(" "));
      box.appendChild(link("list", () => listMessages({ status: status })));
      counts.appendChild(box);
    });
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
    showCounts(data);
    chart(data.rates);
    fill($("breakers"), ["event type", "endpoint", "failures", "next probe"],
      data.open_breakers.map((b) => [b.event_type, b.endpoint, b.consecutive_failures,
                                      time(b.next_probe, true)]));
    fill($("paused"), ["event type", "endpoint", "since", "by"],
      data.paused_endpoints.map((p) => [p.event_type, p.endpoint, time(p.since, true), p.by]));
    fill($("held"), ["ordering key", "held"], data.held_keys.map((h) => [
      link(h.ordering_key, () => listMessages({ ordering_key: h.ordering_key })), h.held]));
    fill($("reasons"), ["reason", "messages", "event types", ""],
      data.failure_reasons.map((r) => [r.reason, r.messages, r.event_types.join(", "),
        link("list", () => listMessages({ status: "Failed", error: r.reason }))]));
  }

  // A viewer's key (can_act false) gets no action at all: no button is made, and the page's
  // style hides every part that acts.
  function showWho(data) {
    const canAct = data.can_act !== false;
    const changed = canAct !== state.canAct;
    state.canAct = canAct;
    document.body.classList.toggle("viewer", !canAct);
    if (changed && state.message) showMessageActions(state.message);
    if (changed && state.view === "endpoints") loadEndpoints();
    if (changed && state.list.pages === 1) search("refresh");
    const who = typeof data.actor === "string" ? data.actor : "";
    $("who").textContent = (who ? "you are " + who : "") +
      (state.canAct ? "" : (who ? " · " : "") + "read only");
  }

  function showConfigured(endpoints) {
    state.configured = endpoints || {};
    const types = $("replay-event-type");
    const chosen = types.value;
    types.replaceChildren(option("", "any"));
    Object.keys(state.configured).forEach((t) => types.appendChild(option(t, t)));
    types.value = chosen && chosen in state.configured ? chosen : "";
    replayEndpoints();
  }

  function option(value, text) {
    const node = el("option", text);
    node.value = value;
    return node;
  }

  async function refreshOverview() {
    const shown = await read("overview", "/overview", (data) => {
      showHealth(data.health || data);
      showWho(data);
      showOverview(data);
      showConfigured(data.endpoints);
      $("refreshed").textContent = "refreshed " + new Date().toISOString().slice(11, 19) +
        " UTC";
    });
    if (!shown && state.key) healthUnknown("Health unknown: the overview did not answer");
  }

  // ---- Views. ----

  function show(view) {
    state.view = view;
    document.querySelectorAll("[data-view-of]").forEach(
      (s) => s.classList.toggle("hidden", s.dataset.viewOf !== view));
    document.querySelectorAll("nav [data-view]").forEach((b) => {
      if (b.dataset.view === view) b.setAttribute("aria-current", "page");
      else b.removeAttribute("aria-current");
    });
  }

  function openView(view) {
    show(view);
    if (!state.key) return;
    if (view === "messages" && !state.list.pages) search("new");
    if (view === "endpoints") loadEndpoints();
    if (view === "audit") loadAudit();
  }

  // The timer skips a part whose last read has not answered yet; "Refresh" (force) reads every
  // part again, since a read under way may have started before what the operator expects.
  function refreshAll(force) {
    if (!state.key) { healthUnknown("No key given"); return; }
    const due = (source) => force === true || idle(source);
    if (due("overview")) refreshOverview();
    const view = state.view;
    if (view === "message" && state.messageId && due("message")) loadMessage(state.messageId);
    // A list paged further is left as it is: refreshing would take the operator back to page 1.
    if (view === "messages" && state.list.pages === 1 && due("messages")) search("refresh");
    if (view === "endpoints" && due("endpoints")) loadEndpoints();
    if (view === "audit" && state.audit.page === 1 && due("audit")) loadAudit("refresh");
  }

  // ---- Messages. ----

  function listMessages(values) {
    Array.from($("filter").elements).forEach((input) => {
      if (input.name) input.value = values[input.name] || "";
    });
    show("messages");
    search("new");
  }

  function readForm(form) {
    const values = {};
    Array.from(form.elements).forEach((input) => {
      if (input.name && input.value.trim()) values[input.name] = input.value.trim();
    });
    ["created_from", "created_to", "since", "until"].forEach((name) => {
      if (values[name]) values[name] = isoFromTyped(values[name]);
    });
    return values;
  }

  // With a key that may act, each row can be chosen for a resend or a cancel of several at once.
  function messageRows(page) {
    return page.messages.map((m) => {
      const cells = [messageLink(m.outbox_message_id), m.event_type, m.status, m.attempt_count,
                     time(m.created_at), m.ordering_key, m.last_error];
      return state.canAct ? [chooser(m.outbox_message_id)].concat(cells) : cells;
    });
  }

  function chooser(id) {
    const box = el("input", null, "act");
    box.type = "checkbox";
    box.value = id;
    box.setAttribute("aria-label", "choose " + id);
    box.checked = state.list.selected.has(id);
    box.addEventListener("change", () => {
      if (box.checked) state.list.selected.add(id); else state.list.selected.delete(id);
      showSelected();
    });
    return box;
  }

  function showSelected() {
    const n = state.list.selected.size;
    $("selected-count").textContent = n ? plural(n, "message") + " chosen" : "";
    $("bulk").className = n && state.canAct ? "row act" : "hidden";
  }

  // "new": the form's filter; "more": the next page of the list shown; "refresh": its first
  // page again (the filter it was listed with, whatever the form holds now).
  async function search(mode) {
    const list = state.list;
    const more = mode === "more";
    const filter = mode === "new" ? readForm($("filter")) : list.filter;
    const params = new URLSearchParams(filter);
    if (more && list.next) params.set("after", list.next);
    await read("messages", "/messages?" + params.toString(), (page) => {
      list.filter = filter;
      if (mode === "new") { list.selected.clear(); showSelected(); }
      const table = $("messages");
      if (more) messageRows(page).forEach((cells) => table.appendChild(tableRow(cells)));
      else {
        fill(table, (state.canAct ? [""] : []).concat(["id", "event type", "status",
          "attempts", "created", "ordering key", "last error"]), messageRows(page));
      }
      list.pages = more ? list.pages + 1 : 1;
      list.next = page.next;
      $("more").className = page.next ? "" : "hidden";
      $("scan-limited").textContent = page.scan_limited
        ? "searched the latest " + page.scan_limit + " messages of this page's range: " +
          "“Next page” searches further (a time range or a status narrows the search)"
        : "";
    }, mode === "refresh" ? null : "search");
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

  function describeFilter(body) {
    const parts = [];
    if (body.event_type) parts.push("event type " + body.event_type);
    if (body.endpoint) parts.push("endpoint " + body.endpoint);
    if (body.error) parts.push("error containing “" + body.error + "”");
    if (body.created_from) parts.push("created from " + utc(body.created_from));
    if (body.created_to) parts.push("created before " + utc(body.created_to));
    return parts.length ? parts.join(", ") : "every Failed message";
  }

  async function planRequeue() {
    let body, dry;
    try {
      body = requeueBody(readForm($("filter")));
      dry = await call("POST", "/requeue", Object.assign({ dry_run: true }, body));
      succeeded("action");
    } catch (e) { fail("action", e); return; }
    if (!dry.requeued) { say("No Failed message matches " + describeFilter(body) + "."); return; }
    const many = plural(dry.requeued, "Failed message");
    const agreed = await confirmDialog("Requeue " + many + "?",
      "Requeue " + many + " (" + describeFilter(body) + "): each becomes Pending, due now, " +
      "with a fresh attempt budget, and goes again to the endpoints that did not receive it (" +
      (dry.endpoints || []).join(", ") + ").",
      "Requeue " + plural(dry.requeued, "message"));
    if (!agreed) return;
    state.requeue = { body: body, actionId: crypto.randomUUID(), total: dry.requeued };
    runRequeue();
  }

  // One batch per call under the plan's action id until the requeue is done, the progress shown
  // after each. A failed call stops the loop; "Go on" sends the same action id again, which goes
  // on where it stopped (no row is requeued twice).
  async function runRequeue() {
    const plan = state.requeue;
    if (!plan) return;
    $("plan").className = "notice";
    $("requeue-run").className = "hidden";
    $("plan-text").textContent = "Requeuing " + plural(plan.total, "message") + "…";
    await once("requeue", async () => {
      const size = Number($("plan").dataset.batch);
      try {
        let step = { done: false, requeued: 0 };
        while (!step.done) {
          if (state.requeue !== plan) return;  // stopped: the rows not reached stay Failed
          step = await call("POST", "/requeue",
            Object.assign({ action_id: plan.actionId, batch_size: size }, plan.body));
          if (step.in_progress) throw new Error("this requeue is running elsewhere: try again");
          $("plan-text").textContent = "Requeued " + step.requeued + " of " + plan.total + "…";
        }
        say("Requeued " + step.requeued + " of " + plan.total + " message(s)");
        $("plan").className = "notice hidden";
        state.requeue = null;
        refreshOverview(); search("refresh");
      } catch (e) {
        fail("action", e);
        $("plan-text").textContent += " stopped: “Go on” goes on where it stopped.";
        $("requeue-run").className = "act";
      }
    });
  }

  // Several chosen messages at once: a dry run says which of them the action takes (and why
  // not the others), the confirmation names how many, and only those are sent.
  async function resendChosen() {
    const chosen = Array.from(state.list.selected);
    let dry;
    try {
      dry = await call("POST", "/resend", { message_ids: chosen, dry_run: true });
      succeeded("action");
    } catch (e) { fail("action", e); return; }
    const ids = dry.would_resend;
    if (!ids.length) {
      say("None of the chosen messages can be resent: " + whySkipped(dry));
      return;
    }
    const many = plural(ids.length, "Processed message");
    const agreed = await confirmDialog("Resend " + many + "?",
      "Send " + many + " again to every endpoint of their event types, each with its own " +
      "webhook-id." + leftAsTheyAre(dry),
      "Resend " + plural(ids.length, "message"));
    if (!agreed) return;
    await actedOnList("/resend", { message_ids: ids }, (done) =>
      "Resent " + plural(done.resent.length, "message") + skippedText(done));
  }

  async function cancelChosen() {
    const chosen = Array.from(state.list.selected);
    let dry;
    try {
      dry = await call("POST", "/cancel", { message_ids: chosen, reason: "dry run",
                                            dry_run: true });
      succeeded("action");
    } catch (e) { fail("action", e); return; }
    const ids = dry.would_cancel;
    if (!ids.length) {
      say("None of the chosen messages can be cancelled: " + whySkipped(dry));
      return;
    }
    const many = plural(ids.length, "Pending message");
    const agreed = await confirmDialog("Cancel " + many + "?",
      "Cancel " + many + ": none is delivered; each becomes Failed with “cancelled by you: " +
      "<reason>” as its error (a requeue sends it after all)." + leftAsTheyAre(dry),
      "Cancel " + plural(ids.length, "message"), true);
    if (!agreed) return;
    await actedOnList("/cancel", { message_ids: ids, reason: agreed.reason }, (done) =>
      "Cancelled " + plural(done.cancelled.length, "message") + skippedText(done));
  }

  function leftAsTheyAre(dry) {
    if (!dry.skipped.length) return "";
    return " " + plural(dry.skipped.length, "chosen message") + " left as " +
      (dry.skipped.length === 1 ? "it is: " : "they are: ") + whySkipped(dry) + ".";
  }

  async function actedOnList(path, body, report) {
    try {
      const done = await act(path, body);
      say(report(done));
      state.list.selected.clear();
      showSelected();
      search("refresh");
      refreshOverview();
    } catch (e) { fail("action", e); }
  }

  // ---- One message. ----

  // Opening a message (a lookup, a link) reports its errors apart from the detail's refresh, so
  // "no outbox message …" stays until the next lookup succeeds.
  async function openMessage(id) {
    if (await loadMessage(id, "lookup")) { show("message"); window.scrollTo(0, 0); }
  }

  function loadMessage(id, errorSource) {
    return read("message", "/messages/" + encodeURIComponent(id), (m) => {
      state.messageId = m.outbox_message_id;
      state.message = m;
      showMessage(m);
    }, errorSource);
  }

  function nextAttempt(m) {
    if (m.held_behind) {
      return nodes("held behind ", messageLink(m.held_behind),
                   " (an earlier message of its ordering key)");
    }
    if (isNever(m.next_attempt_at)) {
      return nodes("held behind an earlier message of ordering key ",
        link(m.ordering_key, () => listMessages({ ordering_key: m.ordering_key })));
    }
    return time(m.next_attempt_at, true);
  }

  function showMessage(m) {
    $("detail-id").textContent = m.outbox_message_id;
    $("detail-refreshed").textContent = "(read " + new Date().toISOString().slice(11, 19) +
      " UTC)";
    const ordering = m.ordering_key
      ? link(m.ordering_key, () => listMessages({ ordering_key: m.ordering_key })) : "";
    const facts = [
      ["event type", m.event_type], ["status", m.status], ["attempts", m.attempt_count],
      ["created", time(m.created_at, true)], ["finished", time(m.finished_at, true)]];
    if (m.status === "Pending" || m.status === "Processing") {
      facts.push(["next attempt", nextAttempt(m)]);
    }
    facts.push(["ordering key", ordering], ["trace id", m.trace_id], ["last error", m.last_error]);
    fill($("detail-facts"), ["field", "value"], facts);
    fill($("detail-endpoints"), ["endpoint", "status", "attempts", "last error"],
      m.endpoints.map((e) => [e.endpoint, e.status, e.attempts, e.last_error]));
    fill($("detail-attempts"), ["#", "endpoint", "outcome", "started", "duration", "HTTP",
                                "error class", "error", "response", ""],
      m.attempts.map((a) => [a.attempt_number, a.endpoint, a.outcome, time(a.started_at),
                             duration(a.duration_ms), a.http_status, a.error_class, a.error,
                             a.response_snippet, a.resend ? "resend" : ""]));
    $("detail-payload").textContent = m.payload;
    $("payload-note").textContent = m.payload_truncated
      ? "Shown: the first " + m.payload.length.toLocaleString("en") + " characters. " +
        "“Download the whole payload” gets all of it."
      : (m.payload_as_text || "");
    showMessageActions(m);
  }

  function showMessageActions(m) {
    const box = $("detail-actions");
    box.replaceChildren();
    if (!state.canAct) return;
    if (m.status === "Failed") box.appendChild(button("Requeue…", () => requeueOne(m), "danger"));
    if (m.status === "Processed") {
      const names = state.configured[m.event_type] || [];
      box.appendChild(button(names.length > 1 ? "Resend to every endpoint…" : "Resend…",
                             () => resendOne(m, null)));
      if (names.length > 1) {
        names.forEach((name) => box.appendChild(
          button("Resend to " + name + "…", () => resendOne(m, name))));
      }
    }
    if (m.status === "Pending") box.appendChild(button("Cancel…", () => cancelOne(m), "danger"));
    if (m.status === "Processing") {
      box.appendChild(el("span", "Being delivered now: its outcome decides what can be done."));
    }
  }

  function failedEndpoints(m) {
    const failed = m.endpoints.filter((e) => e.status !== "Processed").map((e) => e.endpoint);
    return failed.length ? failed : state.configured[m.event_type] || [];
  }

  async function requeueOne(m) {
    const id = m.outbox_message_id;
    const agreed = await confirmDialog("Requeue 1 message?",
      "Requeue 1 Failed message (" + id + ", " + m.event_type + "): it becomes Pending, due " +
      "now, with a fresh attempt budget, and goes again to " +
      (failedEndpoints(m).join(", ") || "its endpoints") + ".", "Requeue 1 message");
    if (!agreed) return;
    await acted("/requeue", { message_ids: [id] }, (done) =>
      "Requeued " + plural(done.requeued, "message") + ": " + id);
  }

  async function resendOne(m, endpoint) {
    const id = m.outbox_message_id;
    const to = endpoint || (state.configured[m.event_type] || []).join(", ") || "its endpoints";
    const agreed = await confirmDialog("Resend 1 message?",
      "Send 1 Processed message (" + id + ", " + m.event_type + ") again to " + to +
      ", with the same webhook-id; " +
      (endpoint ? "the other endpoints keep it as delivered." : "it becomes Pending, due now."),
      "Resend 1 message");
    if (!agreed) return;
    const body = { message_ids: [id] };
    if (endpoint) body.endpoint = endpoint;
    await acted("/resend", body, (done) => "Resent " + plural(done.resent.length, "message") +
      (endpoint ? " to " + endpoint : "") + skippedText(done));
  }

  async function cancelOne(m) {
    const id = m.outbox_message_id;
    const agreed = await confirmDialog("Cancel 1 message?",
      "Cancel 1 Pending message (" + id + ", " + m.event_type + "): it is not delivered; it " +
      "becomes Failed with “cancelled by you: <reason>” as its error (a requeue sends it " +
      "after all).", "Cancel 1 message", true);
    if (!agreed) return;
    await acted("/cancel", { message_ids: [id], reason: agreed.reason }, (done) =>
      "Cancelled " + plural(count(done.cancelled), "message") + skippedText(done));
  }

  function count(value) { return Array.isArray(value) ? value.length : Number(value) || 0; }

  function skippedText(done) {
    return (done.skipped || []).length ? "; left as they are: " + whySkipped(done) : "";
  }

  function whySkipped(done) {
    const why = done.why_skipped || {};
    return done.skipped.map((id) => id + (why[id] ? " (" + why[id] + ")" : "")).join(", ");
  }

  async function acted(path, body, report) {
    try {
      const done = await act(path, body);
      say(report(done));
      if (state.messageId) loadMessage(state.messageId);
      refreshOverview();
    } catch (e) { fail("action", e); }
  }

  async function download() {
    const id = state.messageId;
    if (!id) return;
    try {
      const response = await request("GET",
        "/messages/" + encodeURIComponent(id) + "?payload=full");
      const url = URL.createObjectURL(await response.blob());
      const a = el("a");
      a.href = url;
      a.download = id + ".json";
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      succeeded("download");
    } catch (e) { fail("download", e); }
  }

  // ---- Endpoints. ----

  const STATE_TEXT = { healthy: "healthy", open: "breaker open", "half-open": "half-open",
                       paused: "paused" };

  function endpointRow(e) {
    const stateCell = el("span", STATE_TEXT[e.state] || e.state, "state-" + e.state);
    const paused = e.paused_by || e.paused_at
      ? nodes((e.paused_by || "someone") + " ", time(e.paused_at, true)) : "";
    const actions = el("span", null, "row act");
    if (state.canAct) {
      if (e.state === "open" || e.state === "half-open") {
        actions.appendChild(button("Probe now…", () => probe(e)));
      }
      actions.appendChild(e.paused_by || e.state === "paused"
        ? button("Resume…", () => pauseOrResume("resume", e))
        : button("Pause…", () => pauseOrResume("pause", e)));
    }
    return [e.event_type, e.endpoint, e.url_host, stateCell, time(e.breaker_since, true),
            e.failures, time(e.next_probe, true), paused, rate(e.delivered_per_minute),
            rate(e.failed_per_minute), e.attempts_last_hour, actions];
  }

  // Per minute: 2 attempts an hour is 0.03, not 0.0.
  function rate(value) {
    if (typeof value !== "number") return "";
    return value === 0 ? "0" : value.toFixed(value < 1 ? 2 : 1);
  }

  function loadEndpoints() {
    return read("endpoints", "/endpoints", (data) => {
      fill($("endpoints"), ["event type", "endpoint", "host", "state", "breaker since",
        "failures", "next probe", "paused by", "delivered / min", "failed / min",
        "attempts (hour)", ""], data.endpoints.map(endpointRow));
    });
  }

  async function probe(e) {
    const agreed = await confirmDialog("Probe " + e.endpoint + " now?",
      "Probe " + e.endpoint + " of " + e.event_type + " (" + (e.url_host || "") + ") now: its " +
      "breaker's probe and every message waiting for it become due now and a drain is woken. " +
      "A success closes the breaker; a failure keeps it open.", "Probe now");
    if (!agreed) return;
    await actedOnEndpoint("/probe", e, (done) => "Probe of " + e.endpoint + " of " +
      e.event_type + " is due now; " + plural(done.due || 0, "message") + " due now with it");
  }

  async function pauseOrResume(what, e) {
    const text = what === "pause"
      ? "Pause " + e.endpoint + " of " + e.event_type + ": every message for it waits, " +
        "Pending, spending no attempt, until it is resumed; the event type's other " +
        "endpoints keep receiving."
      : "Resume " + e.endpoint + " of " + e.event_type + ": every message that waited for it " +
        "is due now and a drain is woken.";
    const label = what === "pause" ? "Pause " + e.endpoint : "Resume " + e.endpoint;
    if (!await confirmDialog(label + "?", text, label)) return;
    await actedOnEndpoint("/" + what, e, (done) =>
      (what === "pause" ? "Paused " : "Resumed ") + e.endpoint + " of " + e.event_type +
      (what === "resume" && done.due ? "; " + plural(done.due, "message") + " due now" : ""));
  }

  async function actedOnEndpoint(path, e, report) {
    try {
      const done = await act(path, { event_type: e.event_type, endpoint: e.endpoint });
      say(report(done));
      loadEndpoints();
      refreshOverview();
    } catch (error) { fail("action", error); }
  }

  // ---- Replay: filter → dry run → confirm → result. ----

  function replayEndpoints() {
    const select = $("replay-endpoint");
    const chosen = select.value;
    const type = $("replay-event-type").value;
    const names = type ? state.configured[type] || []
      : Array.from(new Set([].concat(...Object.values(state.configured))));
    select.replaceChildren(option("", "every endpoint"));
    names.forEach((name) => select.appendChild(option(name, name)));
    select.value = names.includes(chosen) ? chosen : "";
  }

  function replayFilter() {
    const body = readForm($("replay-form"));
    if (!body.created_from || !body.created_to) {
      throw new Error("a replay needs a window: give created from and created to");
    }
    return body;
  }

  function describeReplay(body) {
    return "created from " + utc(body.created_from) + " to " + utc(body.created_to) +
      (body.event_type ? ", event type " + body.event_type : "") +
      ", to " + (body.endpoint || "every endpoint");
  }

  async function planReplay() {
    $("replay-result").textContent = "";
    $("replay-plan").className = "notice hidden";
    try {
      const body = replayFilter();
      const dry = await call("POST", "/replay", Object.assign({ dry_run: true }, body));
      state.replay = { body: body, total: dry.would_resend, actionId: crypto.randomUUID() };
      $("replay-plan-text").textContent = "Dry run: " +
        plural(dry.would_resend, "Processed message") + " would be sent again (" +
        describeReplay(body) + ")" + (dry.sample && dry.sample.length ? ", for example:" : ".");
      $("replay-sample").replaceChildren(...(dry.sample || []).map((id) => {
        const li = el("li"); li.appendChild(messageLink(id)); return li;
      }));
      $("replay-run").className = dry.would_resend ? "act" : "hidden";
      $("replay-plan").className = "notice";
      succeeded("action");
    } catch (e) { fail("action", e); }
  }

  async function runReplay() {
    const plan = state.replay;
    if (!plan) return;
    const many = plural(plan.total, "Processed message");
    const agreed = await confirmDialog("Replay " + many + "?",
      "Send " + many + " again (" + describeReplay(plan.body) + "), each with its own " +
      "webhook-id as before.", "Replay " + plural(plan.total, "message"));
    if (!agreed) return;
    await once("replay", async () => {
      try {
        let step = { done: false };
        while (step.done === false) {
          step = await call("POST", "/replay", Object.assign({ action_id: plan.actionId },
                                                             plan.body));
          $("replay-result").textContent = "Replayed " + count(step.resent) + " of " +
            plan.total + "…";
        }
        $("replay-plan").className = "notice hidden";
        $("replay-result").textContent = "Replayed " + plural(count(step.resent), "message") +
          " of the " + plan.total + " planned (" + describeReplay(plan.body) + ").";
        say("Replayed " + plural(count(step.resent), "message"));
        state.replay = null;
        refreshOverview();
      } catch (e) {
        fail("action", e);
        $("replay-result").textContent = "Stopped: “Replay them…” again goes on where it " +
          "stopped (the same action).";
      }
    });
  }

  // ---- Audit: paged (the API's "next" cursor) and filtered. ----

  function resultText(a) {
    if (a.result === null || a.result === undefined) return a.finished_at ? "" : "running";
    return typeof a.result === "string" ? a.result : JSON.stringify(a.result);
  }

  // With no argument: the first page of the form's filter; "refresh": the first page of the
  // filter shown; a cursor: the page after the one shown.
  function loadAudit(before) {
    const audit = state.audit;
    const cursor = before && before !== "refresh" ? before : null;
    const filter = before ? audit.filter : readForm($("audit-filter"));
    if (filter.limit === "50") delete filter.limit;
    const params = new URLSearchParams(filter);
    if (cursor) params.set("before", cursor);
    const query = params.toString();
    return read("audit", "/actions" + (query ? "?" + query : ""), (data) => {
      audit.filter = filter;
      audit.page = cursor ? audit.page + 1 : 1;
      audit.next = data.next || null;
      fill($("actions"), ["when", "who", "address", "user agent", "action", "filter",
        "rows", "result", "dry run", "finished"], data.actions.map((a) => [
        time(a.created_at), a.actor, a.address, a.user_agent, a.action,
        JSON.stringify(a.filter), a.affected, resultText(a), a.dry_run ? "yes" : "",
        time(a.finished_at)]));
      $("audit-next").className = audit.next ? "" : "hidden";
      $("audit-first").className = audit.page > 1 ? "" : "hidden";
      $("audit-page").textContent = "page " + audit.page;
    }, before === "refresh" ? null : "audit-search");
  }

  // ---- The key. ----

  function forgetShown() {
    state.generation += 1;
    state.canAct = false;
    document.body.classList.add("viewer");
    state.list = { filter: {}, next: null, pages: 0, selected: new Set() };
    state.audit = { filter: {}, next: null, page: 1 };
    state.message = null; state.messageId = null;
    state.requeue = null; state.replay = null; state.configured = {};
    if ($("confirm").open) $("confirm-cancel").click();
    document.querySelectorAll("[data-fill]").forEach((n) => n.replaceChildren());
    document.querySelectorAll("form").forEach((f) => f.reset());
    ["plan", "replay-plan"].forEach((id) => { $(id).className = "notice hidden"; });
    ["more", "audit-next", "audit-first", "bulk"].forEach((id) => { $(id).className = "hidden"; });
    clearNotice();
    healthUnknown("No key given");
    show("overview");
  }

  function useKey(given) {
    forgetShown();
    state.key = given;
    sessionStorage.setItem(STORE, given);
    refreshAll();
  }

  // The key is taken from the fragment (#key=…), which no server sees, and the fragment is
  // removed at once. A key given as ?code=… has been sent to the server already: it is not
  // used, and taken out of the address.
  function takeKeyFromAddress() {
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    const query = new URLSearchParams(location.search);
    const inQuery = query.has("code");
    if (location.hash || inQuery) {
      query.delete("code");
      const rest = query.toString();
      history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
    }
    if (fragment.get("key")) useKey(fragment.get("key"));
    if (inQuery) {
      fail("address", new Error("The key in the address (?code=…) is not used: an address " +
        "reaches the server and its logs. Give the key after # (…/console#key=…) or in the " +
        "form; consider that one seen."));
    }
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const given = $("key-input").value;
    $("key-input").value = "";
    if (given) useKey(given);
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(STORE);
    state.key = "";
    forgetShown();
    say("Key forgotten: nothing read with it is left on this page.");
  });
  $("refresh").addEventListener("click", () => refreshAll(true));
  $("notice-close").addEventListener("click", clearNotice);
  document.querySelectorAll("nav [data-view]").forEach((b) => b.addEventListener(
    "click", () => openView(b.dataset.view)));
  $("lookup").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("lookup-id").value.trim();
    if (!state.key) fail("lookup", new Error("Give a key first: the message is read with it."));
    else if (id) openMessage(id);
  });
  $("filter").addEventListener("submit", (event) => {
    event.preventDefault(); search("new");
  });
  $("more").addEventListener("click", () => search("more"));
  $("requeue-plan").addEventListener("click", planRequeue);
  $("requeue-run").addEventListener("click", runRequeue);
  $("requeue-cancel").addEventListener("click", () => {
    state.requeue = null; $("plan").className = "notice hidden";
  });
  $("download").addEventListener("click", download);
  $("resend-chosen").addEventListener("click", resendChosen);
  $("cancel-chosen").addEventListener("click", cancelChosen);
  $("replay-event-type").addEventListener("change", replayEndpoints);
  $("replay-form").addEventListener("submit", (event) => { event.preventDefault(); planReplay(); });
  $("replay-run").addEventListener("click", runReplay);
  $("audit-filter").addEventListener("submit", (event) => {
    event.preventDefault(); loadAudit();
  });
  $("audit-next").addEventListener("click", () => loadAudit(state.audit.next));
  $("audit-first").addEventListener("click", () => loadAudit());
  window.addEventListener("hashchange", takeKeyFromAddress);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refreshAll();
  });

  takeKeyFromAddress();
  if (!state.generation) refreshAll();
  setInterval(() => { if (document.visibilityState === "visible") refreshAll(); }, REFRESH_MS);
})();
