// leasehold dashboard. Talks to the node that served it with Connect's JSON protocol
// (POST /leasehold.v1.<Service>/<Method>, Content-Type application/json), like any
// other client, and shows what the caller may read. No framework, no dependencies.
"use strict";

(() => {
  const POLL_MS = 500; // List while the node serves no Watch
  const REFRESH_MS = 2000; // List under Watch, for the TTLs (keepalives make no events)
  const SOON_MS = 250; // List this soon after an event, for what events do not carry
  const CLUSTER_MS = 2000; // Status and Members
  const FEED_MAX = 300; // events kept in the feed
  const TOKEN_KEY = "leasehold.token";

  const state = {
    cfg: { auth: false, procedures: [] },
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    prefix: "",
    locks: new Map(), // name → LockInfo (JSON), as last seen
    seenAt: 0, // performance.now() when the lock table was last fetched
    selected: "", // the lock whose ledger is open
    generation: 0, // bumped to stop the running loops (new token, new prefix)
    feedCount: 0,
    recent: [], // {at, e}: the Watch events of the last seconds, for refresh
    streaming: false, // a Watch stream is open
    abort: null, // aborts the open Watch stream
    truncated: false, // the last List had more locks than it returned
  };

  const $ = (sel) => document.querySelector(sel);

  // ---- Connect ------------------------------------------------------------------------

  // RPCError is a Connect error: code ("permission_denied", …) and message.
  class RPCError extends Error {
    constructor(code, message) {
      super(message);
      this.code = code;
    }
  }

  function headers(contentType) {
    const h = { "Content-Type": contentType, "Connect-Protocol-Version": "1" };
    if (state.token) h.Authorization = "Bearer " + state.token;
    return h;
  }

  const serves = (service, method) => state.cfg.procedures.includes(`/leasehold.v1.${service}/${method}`);

  // errorOf turns a failed answer's body (Connect's JSON error) into an RPCError.
  function errorOf(status, text) {
    try {
      const e = JSON.parse(text);
      if (e && e.code) return new RPCError(e.code, e.message || e.code);
    } catch (_) {
      // not JSON: a proxy's page, say
    }
    return new RPCError("unknown", `HTTP ${status}${text ? ": " + text.slice(0, 200) : ""}`);
  }

  // call makes a unary RPC and returns the answer's JSON.
  async function call(service, method, body, signal) {
    const resp = await fetch(`/leasehold.v1.${service}/${method}`, {
      method: "POST", headers: headers("application/json"), body: JSON.stringify(body || {}), signal,
    });
    const text = await resp.text();
    if (!resp.ok) throw errorOf(resp.status, text);
    return text ? JSON.parse(text) : {};
  }

  // stream makes a server-streaming RPC with Connect's streaming protocol: each message
  // is an envelope of 1 byte of flags and a 4-byte big-endian length; the last one has
  // flag 0x02 and carries the end-of-stream JSON ({"error": …} when the call failed).
  // onMessage gets each message's JSON. It resolves when the stream ends cleanly.
  async function stream(service, method, body, signal, onMessage) {
    const payload = new TextEncoder().encode(JSON.stringify(body || {}));
    const req = new Uint8Array(5 + payload.length);
    new DataView(req.buffer).setUint32(1, payload.length);
    req.set(payload, 5);
    const resp = await fetch(`/leasehold.v1.${service}/${method}`, {
      method: "POST", headers: headers("application/connect+json"), body: req, signal,
    });
    if (!resp.ok) throw errorOf(resp.status, await resp.text());
    const reader = resp.body.getReader();
    const utf8 = new TextDecoder();
    let buf = new Uint8Array(0); // bytes not parsed yet
    for (;;) {
      const { done, value } = await reader.read();
      if (done) throw new RPCError("unavailable", "the stream ended without its end-of-stream message");
      if (buf.length) {
        const joined = new Uint8Array(buf.length + value.length);
        joined.set(buf);
        joined.set(value, buf.length);
        buf = joined;
      } else {
        buf = value;
      }
      const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
      let off = 0;
      while (buf.length - off >= 5) {
        const flags = buf[off];
        const size = view.getUint32(off + 1);
        if (buf.length - off < 5 + size) break;
        const msg = utf8.decode(buf.subarray(off + 5, off + 5 + size));
        off += 5 + size;
        if (flags & 0x01) throw new RPCError("internal", "the server sent a compressed message, which this page did not ask for");
        if (flags & 0x02) {
          const end = msg ? JSON.parse(msg) : {};
          if (end.error) throw new RPCError(end.error.code || "unknown", end.error.message || end.error.code || "stream failed");
          return;
        }
        onMessage(JSON.parse(msg));
      }
      buf = buf.slice(off); // a copy: the reader may reuse value
    }
  }

  // ---- errors and auth ------------------------------------------------------------------

  function explain(err) {
    if (err instanceof RPCError) {
      switch (err.code) {
        case "permission_denied": return "not allowed: " + err.message;
        case "unauthenticated": return "token needed or not known: " + err.message;
        default: return `${err.code}: ${err.message}`;
      }
    }
    return "cannot reach the node: " + (err && err.message ? err.message : String(err));
  }

  let shownError = "";
  function showError(where, err) {
    const text = err ? `${where}: ${explain(err)}` : "";
    if (text === shownError) return;
    shownError = text;
    const el = $("#error");
    el.textContent = text;
    el.hidden = !text;
    if (err instanceof RPCError && err.code === "unauthenticated" && state.cfg.auth) askToken();
  }

  // hintPrefix adds to a refusal of every lock name what to do about it.
  function hintPrefix(err) {
    if (err instanceof RPCError && err.code === "permission_denied" && !state.prefix) {
      err.message += " (enter a prefix this token may read)";
    }
  }

  function askToken() {
    $("#auth").hidden = false;
    $("#token").focus();
  }

  // ---- formatting -------------------------------------------------------------------------

  const enumName = (v, prefix, dflt) => (v ? String(v).replace(prefix, "").toLowerCase() : dflt);
  const className = (c) => enumName(c, "LOCK_CLASS_", "?");
  function modeName(l) {
    const m = enumName(l.mode, "LOCK_MODE_", "exclusive");
    return m === "semaphore" ? `semaphore(${l.limit || 0})` : m;
  }
  function holderText(h) {
    if (!h) return "";
    const parts = [];
    if (h.host) parts.push(h.pid ? `${h.host}:${h.pid}` : h.host);
    else if (h.pid) parts.push(`pid ${h.pid}`);
    if (h.note) parts.push(h.note);
    return parts.join(" — ") || "(no description)";
  }
  function holdersOf(l) {
    if (l.holders && l.holders.length) return l.holders;
    if (!l.held) return [];
    return [{ token: l.token, holder: l.holder, ttlRemainingMs: l.ttlRemainingMs }];
  }
  function ttlText(ms) {
    if (ms < 0) return "—";
    return (ms / 1000).toFixed(1) + " s";
  }
  const clock = (d) => d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  // ---- the lock table ---------------------------------------------------------------------

  function renderLocks() {
    const body = $("#locks tbody");
    const rows = [];
    for (const l of state.locks.values()) {
      const hs = holdersOf(l);
      const tr = el("tr", { "data-name": l.name, tabIndex: 0, title: "open " + l.name },
        el("td", { class: "name" }, el("code", {}, l.name)),
        el("td", { class: "class" }, className(l.class)),
        el("td", { class: "mode" }, modeName(l)),
        el("td", { class: "holder" }, hs.length ? hs.map((h) => holderText(h.holder)).join("; ") : el("span", { class: "muted" }, l.delayRemainingMs > 0 ? "free, in lock-delay" : "free")),
        el("td", { class: "token" }, hs.map((h) => h.token || "0").join(", ")),
        el("td", { class: "ttl" }),
        el("td", { class: "waiters" }, l.waiters || 0));
      if (l.name === state.selected) tr.classList.add("selected");
      rows.push(tr);
    }
    const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest("#locks tr[data-name]");
    body.replaceChildren(...rows);
    if (focused) {
      const again = rows.find((tr) => tr.dataset.name === focused.dataset.name);
      if (again) again.focus();
    }
    $("#locks-empty").hidden = rows.length > 0;
    $("#lock-count").textContent = state.truncated ? `(the first ${rows.length}: narrow the prefix)` : `(${rows.length})`;
    tickTTL();
  }

  // scheduleRender renders the table at the next frame, once however many events came
  // before it.
  let renderPending = false;
  function scheduleRender() {
    if (renderPending) return;
    renderPending = true;
    requestAnimationFrame(() => {
      renderPending = false;
      renderLocks();
    });
  }

  // tickTTL counts the TTLs down between updates, from what the leader said when the
  // table was fetched.
  function tickTTL() {
    const elapsed = performance.now() - state.seenAt;
    for (const tr of document.querySelectorAll("#locks tbody tr")) {
      const l = state.locks.get(tr.dataset.name);
      if (!l) continue;
      const hs = holdersOf(l);
      const cell = tr.querySelector("td.ttl");
      if (!hs.length) {
        cell.textContent = l.delayRemainingMs > 0 ? "delay " + ttlText(Math.max(0, Number(l.delayRemainingMs) - elapsed)) : "";
        continue;
      }
      const ms = hs.map((h) => {
        const t = Number(h.ttlRemainingMs ?? -1);
        return t < 0 ? -1 : Math.max(0, t - elapsed);
      });
      cell.textContent = ms.map(ttlText).join(", ");
      const least = Math.min(...ms.filter((t) => t >= 0));
      cell.classList.toggle("low", least < 3000 && least > 0);
      cell.classList.toggle("gone", least === 0);
    }
  }

  // ---- the event feed ---------------------------------------------------------------------

  // addEvents puts events at the top of the feed, the last one on top: each
  // {kind, name, token, holder, note, revision}. Of a batch larger than the feed only
  // the newest are drawn.
  function addEvents(events) {
    const feed = $("#feed");
    const now = clock(new Date());
    const frag = document.createDocumentFragment();
    for (const e of events.slice(-FEED_MAX)) {
      frag.prepend(el("li", { "data-kind": e.kind, "data-name": e.name || "", "data-token": e.token || "", "data-revision": e.revision || "" },
        el("span", { class: "muted" }, now + (e.revision ? ` r${e.revision}` : "") + " "),
        el("span", { class: "kind kind-" + e.kind }, e.kind.replace("_", " ")), " ",
        e.name ? el("code", {}, e.name) : "",
        e.token ? ` #${e.token}` : "",
        e.holder ? ` by ${holderText(e.holder)}` : "",
        e.note ? ` (${e.note})` : ""));
    }
    feed.prepend(frag);
    state.feedCount += events.length;
    feed.dataset.count = state.feedCount;
    while (feed.children.length > FEED_MAX) feed.lastElementChild.remove();
  }
  const addEvent = (e) => addEvents([e]);

  // diff derives the feed from two listings, when the node serves no Watch: a token that
  // appears was acquired; one that disappears ended — released, or expired when its TTL
  // had (nearly) run out when it was last seen. Changes between two polls that undo each
  // other are not seen.
  function diff(before, after) {
    for (const [name, l] of after) {
      const was = before.get(name);
      const old = new Map(was ? holdersOf(was).map((h) => [h.token, h]) : []);
      for (const h of holdersOf(l)) {
        if (!old.has(h.token)) addEvent({ kind: "acquired", name, token: h.token, holder: h.holder });
      }
      if ((l.waiters || 0) !== ((was && was.waiters) || 0)) {
        addEvent({ kind: "waiters", name, note: `${(was && was.waiters) || 0} → ${l.waiters || 0} waiting` });
      }
    }
    for (const [name, was] of before) {
      const now = after.get(name);
      const current = new Set(now ? holdersOf(now).map((h) => h.token) : []);
      for (const h of holdersOf(was)) {
        if (current.has(h.token)) continue;
        const ttl = Number(h.ttlRemainingMs ?? -1);
        const expired = ttl >= 0 && ttl <= POLL_MS * 2;
        addEvent({ kind: expired ? "expired" : "released", name, token: h.token, holder: h.holder, note: "seen by polling" });
      }
    }
  }

  // ---- Watch ------------------------------------------------------------------------------

  const kindName = (k) => enumName(k, "EVENT_KIND_", "unknown");
  const ENDS = ["released", "expired", "revoked", "force_released", "disconnected"]; // the kinds that end a hold
  const revText = (r) => (r ? `${r.index || 0}.${r.offset || 0}` : "");

  // applyEvent changes the table as the Watch event e says. What events do not carry
  // (the TTLs, a waiter granted from the queue) the next List brings.
  function applyEvent(e) {
    const kind = kindName(e.kind);
    if (kind === "epoch") {
      for (const [name, l] of state.locks) {
        if (className(l.class) === "efficiency") state.locks.delete(name);
      }
      return;
    }
    let l = state.locks.get(e.name);
    if (!l) {
      if (kind !== "acquired" && kind !== "queued") return;
      l = { name: e.name, class: e.class, mode: e.mode, limit: e.limit, holders: [], waiters: 0 };
      state.locks.set(e.name, l);
    }
    l.holders = holdersOf(l);
    switch (kind) {
      case "acquired":
        if (!l.holders.some((h) => h.token === e.token)) {
          l.holders.push({ token: e.token, holder: e.holder, ttlRemainingMs: "-1" });
        }
        l.held = true;
        l.class = e.class;
        l.mode = e.mode;
        l.limit = e.limit;
        break;
      case "queued":
        l.waiters = Math.max((l.waiters || 0) + 1, e.position || 0);
        break;
      case "wait_ended":
        l.waiters = Math.max(0, (l.waiters || 0) - 1);
        break;
      default:
        if (ENDS.includes(kind)) {
          l.holders = l.holders.filter((h) => h.token !== e.token);
          l.held = l.holders.length > 0;
        }
        // any other kind, one this page does not know: the next List shows its effect
    }
    if (!l.held && !l.waiters) state.locks.delete(e.name);
  }

  // refresh lists the locks and takes the TTLs, waiters and anything the events missed
  // from the answer, then applies again the events that arrived since the List was sent
  // (applying an event twice changes nothing).
  async function refresh(gen) {
    const sent = performance.now();
    const resp = await call("LockService", "List", { prefix: state.prefix, limit: 10000 });
    if (gen !== state.generation) return;
    state.locks = new Map((resp.locks || []).map((l) => [l.name, l]));
    for (const r of state.recent) if (r.at >= sent) applyEvent(r.e);
    state.seenAt = performance.now();
    state.truncated = !!resp.truncated;
    renderLocks();
    if (state.selected) refreshLedger();
  }

  // watchLocks drives the table and the feed from LockService.Watch: it starts the
  // stream, lists the locks once the stream stands, applies every event as it comes and
  // lists again every REFRESH_MS (and soon after an event) for the TTLs. When the stream
  // breaks it resumes from the last revision it got, so no event is lost or repeated;
  // when that revision is no longer held ("compacted") it starts afresh and says so.
  async function watchLocks(gen) {
    $("#feed-source").textContent = "(LockService.Watch)";
    let next = null;
    let backoff = 250;
    let soon = null;
    const refreshSoon = () => {
      if (soon) return;
      soon = setTimeout(() => {
        soon = null;
        refresh(gen).catch((err) => showError("locks", err));
      }, SOON_MS);
    };
    const ticker = setInterval(() => {
      if (gen !== state.generation) {
        clearInterval(ticker);
        return;
      }
      if (state.streaming) refresh(gen).catch((err) => showError("locks", err));
    }, REFRESH_MS);
    while (gen === state.generation) {
      const abort = new AbortController();
      state.abort = abort;
      let listed = false;
      try {
        const body = { prefix: state.prefix };
        if (next) body.start = next;
        await stream("LockService", "Watch", body, abort.signal, (resp) => {
          if (gen !== state.generation) return;
          let relist = false;
          const at = performance.now();
          const shown = [];
          for (const e of resp.events || []) {
            const kind = kindName(e.kind);
            state.recent.push({ at, e });
            applyEvent(e);
            shown.push({ kind, name: e.name, token: e.token, holder: e.holder, note: eventNote(e), revision: revText(e.revision) });
            relist = relist || !ENDS.includes(kind);
          }
          if (shown.length) addEvents(shown);
          const cutoff = performance.now() - 2 * REFRESH_MS;
          const keep = state.recent.findIndex((r) => r.at >= cutoff);
          if (keep > 0) state.recent.splice(0, keep);
          else if (keep < 0) state.recent.length = 0;
          next = resp.next || next;
          $("#feed-source").textContent = `(LockService.Watch, next r${revText(next)})`;
          state.streaming = true;
          backoff = 250;
          setLive("live", "live");
          showError("", null);
          if (!listed) {
            listed = true;
            refresh(gen).catch((err) => showError("locks", err));
          } else if ((resp.events || []).length) {
            scheduleRender();
            // Events carry no TTL, and a grant from the queue does not say it left it.
            if (relist) refreshSoon();
            if (state.selected) refreshLedger();
          }
        });
        throw new RPCError("unavailable", "the stream ended");
      } catch (err) {
        state.streaming = false;
        if (gen !== state.generation) return;
        if (err instanceof RPCError && err.code === "failed_precondition" && /compacted/.test(err.message)) {
          addEvent({ kind: "gap", note: `events missed: ${err.message}; starting afresh` });
          next = null;
        }
        if (err instanceof RPCError && (err.code === "permission_denied" || err.code === "unauthenticated")) {
          setLive("stale", "stale");
          hintPrefix(err);
          showError("locks", err);
          await sleep(5000);
          continue;
        }
        setLive("reconnecting", "stale");
        if (!(err instanceof RPCError && err.code === "unavailable")) showError("watch", err);
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 5000);
      }
    }
  }

  function eventNote(e) {
    const parts = [];
    if (e.position) parts.push(`place ${e.position}`);
    if (e.reason) parts.push(e.reason);
    if (e.epoch) parts.push(`epoch ${e.epoch.slice(0, 8)}`);
    return parts.join(", ");
  }

  // ---- data sources -------------------------------------------------------------------------

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  function setLive(text, cls) {
    const b = $("#live");
    b.textContent = text;
    b.className = "badge " + (cls || "");
  }

  // pollLocks lists the locks every POLL_MS, derives the feed from the differences and
  // updates the ledger panel, until the generation changes.
  async function pollLocks(gen) {
    $("#feed-source").textContent = "(derived from List every 500 ms)";
    let first = true;
    while (gen === state.generation) {
      try {
        const resp = await call("LockService", "List", { prefix: state.prefix, limit: 10000 });
        if (gen !== state.generation) return;
        const next = new Map((resp.locks || []).map((l) => [l.name, l]));
        if (!first) diff(state.locks, next);
        first = false;
        state.locks = next;
        state.seenAt = performance.now();
        state.truncated = !!resp.truncated;
        renderLocks();
        setLive("polling", "live");
        showError("", null);
        if (state.selected) refreshLedger();
      } catch (err) {
        if (gen !== state.generation) return;
        setLive("stale", "stale");
        hintPrefix(err);
        showError("locks", err);
      }
      await sleep(POLL_MS);
    }
  }

  // pollCluster reads this node's Status and the Members every CLUSTER_MS.
  async function pollCluster(gen) {
    while (gen === state.generation) {
      let status = null;
      let members = null;
      let failure = null;
      try {
        [status, members] = await Promise.all([call("ClusterService", "Status"), call("ClusterService", "Members")]);
      } catch (err) {
        failure = err;
      }
      if (gen !== state.generation) return;
      renderCluster(status, members, failure);
      await sleep(CLUSTER_MS);
    }
  }

  function renderCluster(st, members, failure) {
    const dl = $("#status");
    if (failure) {
      dl.replaceChildren(el("dt", {}, "this node"), el("dd", { class: "health-bad" }, explain(failure)));
      $("#members tbody").replaceChildren();
      return;
    }
    $("#node").textContent = `node ${st.nodeId || "?"} (${st.role || "?"})`;
    const lag = Number(st.commitIndex || 0) - Number(st.appliedIndex || 0);
    const pairs = [
      ["node", `${st.nodeId || "?"} at ${st.apiAddr || location.host}`],
      ["role", st.role || "?"],
      ["leader", st.leader ? `${st.leader} (${st.leaderApiAddr || "address unknown"})` : "none known"],
      ["term", st.term || "0"],
      ["commit / applied", `${st.commitIndex || 0} / ${st.appliedIndex || 0}` + (lag ? ` (${lag} behind)` : "")],
      ["leases / locks", `${st.leases || 0} / ${st.locks || 0}`],
      ["last token", st.lastToken || "0"],
      ["version", st.version || "?"],
      ["up", ttlText(Number(st.uptimeMs || 0))],
    ];
    dl.replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const rows = (members.members || []).map((m) => {
      const self = m.nodeId === st.nodeId;
      const role = m.leader ? "leader" : self ? st.role : "follower";
      let health;
      if (self) health = st.leader ? ["health-ok", lag > 1000 ? `catching up (${lag})` : "ok (this node)"] : ["health-bad", "no leader known"];
      else if (m.leader) health = st.leader === m.nodeId ? ["health-ok", "leading (this node hears it)"] : ["health-bad", "not heard by this node"];
      else health = ["muted", "not checked from here"];
      return el("tr", { "data-node": m.nodeId },
        el("td", {}, m.nodeId + (self ? " (this node)" : "")),
        el("td", { class: "mono" }, m.apiAddr || ""),
        el("td", {}, m.suffrage || ""),
        el("td", {}, role),
        el("td", { class: health[0] }, health[1]));
    });
    $("#members tbody").replaceChildren(...rows);
  }

  // ---- one lock: its holders now and its ledger ---------------------------------------------

  // refreshLedger shows the selected lock's holders (Describe) and ledger (History) again:
  // at once when nothing is in flight, else once more when the call in flight is done,
  // and at most every LEDGER_MS.
  const LEDGER_MS = 200;
  let ledgerBusy = false;
  let ledgerAgain = false;
  function refreshLedger() {
    if (!state.selected) return;
    if (ledgerBusy) {
      ledgerAgain = true;
      return;
    }
    ledgerBusy = true;
    showLedger(state.selected).finally(() => setTimeout(() => {
      ledgerBusy = false;
      if (ledgerAgain) {
        ledgerAgain = false;
        refreshLedger();
      }
    }, LEDGER_MS));
  }

  const endName = (e) => enumName(e, "TENURE_END_", "").replace("_", " ");
  function when(ms) {
    if (!(Number(ms) > 0)) return "?";
    const d = new Date(Number(ms));
    const day = d.toDateString() === new Date().toDateString() ? "" : d.toLocaleDateString() + " ";
    return day + clock(d);
  }

  async function showLedger(name) {
    try {
      const history = serves("LockService", "History");
      const [d, h] = await Promise.all([
        call("LockService", "Describe", { name }),
        history ? call("LockService", "History", { name }) : null,
      ]);
      if (name !== state.selected) return;
      const l = d.lock || { name };
      const hs = holdersOf(l);
      const known = l.held || l.waiters || l.delayRemainingMs > 0;
      $("#ledger-now").replaceChildren(
        known
          ? el("p", {}, `${className(l.class)}, ${modeName(l)}, ${l.waiters || 0} waiting` + (l.delayRemainingMs > 0 ? `, lock-delay ${ttlText(Number(l.delayRemainingMs))}` : ""))
          : "",
        hs.length
          ? el("ul", {}, ...hs.map((x) => el("li", {}, `#${x.token} ${holderText(x.holder)}, TTL ${ttlText(Number(x.ttlRemainingMs ?? -1))}`)))
          : el("p", { class: "muted" }, "not held"));
      if (!history) {
        $("#ledger-note").textContent = "This node serves no LockService.History: no ledger to show.";
        $("#ledger").hidden = true;
        return;
      }
      // Newest first: the leader's efficiency tenures, the marker of what earlier leaders
      // lost (TENURE_END_LEADER_LOST), then the replicated correctness tenures.
      const tenures = (h.tenures || []).slice().reverse();
      $("#ledger").hidden = tenures.length === 0;
      $("#ledger-note").textContent = tenures.length
        ? "Newest first; times are the leader's clock, for display. Efficiency tenures are the current leader's memory only."
        : "No tenures recorded.";
      $("#ledger tbody").replaceChildren(...tenures.map((x) => x.end === "TENURE_END_LEADER_LOST"
        ? el("tr", { "data-token": "0", "data-end": "leader lost", class: "lost" },
          el("td", { class: "token" }, "—"),
          el("td", {}, ""),
          el("td", {}, className(x.class)),
          el("td", { class: "mono" }, ""),
          el("td", { class: "mono" }, when(x.endUnixMs)),
          el("td", {}, el("em", {}, `lost with the leader: tenures before this are unknown (leader of epoch ${x.epoch || "?"} began serving)`)))
        : el("tr", { "data-token": x.token || "0", "data-end": endName(x.end) || "held" },
          el("td", { class: "token" }, x.token || "0"),
          el("td", {}, holderText(x.holder)),
          el("td", {}, className(x.class)),
          el("td", { class: "mono" }, when(x.startUnixMs)),
          el("td", { class: "mono" }, x.end ? when(x.endUnixMs) : ""),
          el("td", {}, x.end ? endName(x.end) + (x.reason ? ` (${x.reason})` : "") : el("strong", {}, "held now")))));
    } catch (err) {
      if (name === state.selected) $("#ledger-now").replaceChildren(el("p", { class: "error" }, explain(err)));
    }
  }

  function openLedger(name) {
    state.selected = name;
    $("#ledger-section").hidden = false;
    $("#ledger-name").textContent = name;
    $("#ledger-now").replaceChildren();
    $("#ledger tbody").replaceChildren();
    $("#ledger-note").textContent = "";
    for (const tr of document.querySelectorAll("#locks tbody tr")) tr.classList.toggle("selected", tr.dataset.name === name);
    refreshLedger();
  }

  // ---- start --------------------------------------------------------------------------------

  function restart() {
    const gen = ++state.generation;
    if (state.abort) state.abort.abort();
    state.locks = new Map();
    state.recent = [];
    renderLocks();
    if (serves("LockService", "Watch")) watchLocks(gen);
    else pollLocks(gen);
    pollCluster(gen);
  }

  // prefixFromHash reads the prefix of a #prefix=… link. A malformed escape (a link
  // typed or cut by hand: #prefix=%E0) must not stop the page: it is taken as written.
  function prefixFromHash(h) {
    const m = h.match(/^#prefix=(.*)$/);
    if (!m) return "";
    try {
      return decodeURIComponent(m[1]);
    } catch {
      return m[1];
    }
  }

  async function main() {
    try {
      const resp = await fetch("/ui/config.json");
      if (resp.ok) state.cfg = await resp.json();
    } catch (err) {
      showError("config", err);
    }
    state.prefix = prefixFromHash(location.hash);
    $("#prefix").value = state.prefix;
    $("#logout").hidden = !state.cfg.auth;
    $("#filter").addEventListener("submit", (ev) => {
      ev.preventDefault();
      state.prefix = $("#prefix").value.trim();
      history.replaceState(null, "", state.prefix ? "#prefix=" + encodeURIComponent(state.prefix) : location.pathname);
      restart();
    });
    $("#auth").addEventListener("submit", (ev) => {
      ev.preventDefault();
      state.token = $("#token").value.trim();
      sessionStorage.setItem(TOKEN_KEY, state.token);
      $("#token").value = "";
      $("#auth").hidden = true;
      showError("", null);
      restart();
    });
    $("#logout").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      state.token = "";
      state.generation++;
      if (state.abort) state.abort.abort();
      state.locks = new Map();
      renderLocks();
      askToken();
    });
    $("#locks tbody").addEventListener("click", (ev) => {
      const tr = ev.target.closest("tr[data-name]");
      if (tr) openLedger(tr.dataset.name);
    });
    $("#locks tbody").addEventListener("keydown", (ev) => {
      const tr = ev.target.closest("tr[data-name]");
      if (tr && (ev.key === "Enter" || ev.key === " ")) {
        ev.preventDefault();
        openLedger(tr.dataset.name);
      }
    });
    $("#ledger-close").addEventListener("click", () => {
      state.selected = "";
      $("#ledger-section").hidden = true;
      renderLocks();
    });
    setInterval(tickTTL, 100);
    if (state.cfg.auth && !state.token) {
      setLive("needs a token", "stale");
      askToken();
      return;
    }
    restart();
  }

  main();
})();
