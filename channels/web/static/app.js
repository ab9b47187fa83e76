// Web chat: one conversation view fed by the JSON API and a server-sent-events stream.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { cid: null, stream: null, working: false, pending: [], notices: [], live: null };

function randomHex(bytes) {
  const a = new Uint8Array(bytes);
  crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(16).padStart(2, "0")).join("");
}

function escapeHtml(text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

// A small, safe Markdown subset: everything is escaped first, then code, bold, italics and links.
function renderMarkdown(text) {
  const parts = text.split(/```/);
  return parts.map((part, i) => {
    if (i % 2 === 1) {
      const body = part.replace(/^[\w+-]*\n/, "");
      return `<pre><code>${escapeHtml(body.replace(/\n$/, ""))}</code></pre>`;
    }
    return part.split(/\n{2,}/).filter((p) => p.trim()).map((p) => {
      let html = escapeHtml(p);
      html = html.replace(/`([^`\n]+)`/g, "<code>$1</code>");
      html = html.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
      html = html.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener">$1</a>');
      return `<p>${html.replace(/\n/g, "<br>")}</p>`;
    }).join("");
  }).join("");
}

async function api(path, options = {}) {
  const init = { headers: {}, ...options };
  if (init.body !== undefined) {
    init.method = init.method || "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(init.body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) { location.href = "/login"; throw new Error("log in first"); }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

function setWorking(working, label) {
  state.working = working;
  $("stop").disabled = !working;
  $("state").textContent = label || (working ? "Working…" : "");
  $("state").classList.toggle("working", working);
}

function messageElement(role, html, meta, extraClass) {
  const el = document.createElement("div");
  el.className = `msg ${role}${extraClass ? " " + extraClass : ""}`;
  el.innerHTML = html;
  if (meta) {
    const m = document.createElement("div");
    m.className = "meta";
    m.textContent = meta;
    el.appendChild(m);
  }
  return el;
}

// Whitespace and invisible characters made visible, as on the Slack card (core.approvals.visible):
// a run of spaces, a tab or a U+202E cannot hide part of what an approver approves.
const HIDDEN = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]$/u;
const BLANK = new Set([0x034f, 0x115f, 0x1160, 0x17b4, 0x17b5, 0x2800, 0x3164, 0xffa0]);

function isHidden(ch, code) {
  return HIDDEN.test(ch) || BLANK.has(code) || (code >= 0x180b && code <= 0x180f) || (code >= 0xfe00 && code <= 0xfe0f)
    || (code >= 0xe0100 && code <= 0xe01ef) || (ch !== " " && /^\p{Zs}$/u.test(ch));
}

function visible(text) {
  const chars = Array.from(text);
  let out = "";
  for (let i = 0; i < chars.length;) {
    const ch = chars[i];
    if (ch === " " || ch === "\n" || ch === "`") {
      let j = i;
      while (j < chars.length && chars[j] === ch) j++;
      const run = j - i;
      if (ch === " " && (run >= 3 || j === chars.length || chars[j] === "\n")) out += `⟦${run} space${run > 1 ? "s" : ""}⟧`;
      else if (ch === "\n" && run >= 3) out += `\n⟦${run} line breaks⟧\n`;
      else if (ch === "`" && run >= 3) out += `⟦${run} backticks⟧`;
      else out += ch.repeat(run);
      i = j;
      continue;
    }
    const code = ch.codePointAt(0);
    if (ch === "\t") out += "⟦TAB⟧";
    else if (ch === "\r") out += "⟦CR⟧";
    else if (isHidden(ch, code)) out += `⟦U+${code.toString(16).toUpperCase().padStart(4, "0")}⟧`;
    else out += ch;
    i++;
  }
  return out;
}

// Every argument in full, one per line; a value's further lines start with "│" (none passes for another argument).
function argumentsText(args) {
  const lines = Object.entries(args).map(([k, v]) =>
    `${visible(k)}: ${visible(typeof v === "string" ? v : JSON.stringify(v)).replaceAll("\n", "\n│ ")}`);
  return lines.join("\n") || "(no arguments)";
}

function approvalElement(a) {
  const el = document.createElement("div");
  el.className = `msg approval ${a.status}`;
  const args = argumentsText(a.arguments);
  el.innerHTML = `<p><strong>Approval needed:</strong> the agent wants to run <code>${escapeHtml(a.tool)}</code></p><pre><code>${escapeHtml(args)}</code></pre>`;
  const meta = document.createElement("div");
  meta.className = "meta";
  if (a.status !== "pending") {
    meta.textContent = a.summary;
    if (a.edited_arguments) {  // an approver's edit: what ran instead
      const ran = document.createElement("pre");
      ran.innerHTML = `<code>${escapeHtml(argumentsText(a.edited_arguments))}</code>`;
      el.appendChild(ran);
    }
    el.appendChild(meta);
    return el;
  }
  meta.textContent = `${a.reminded ? "Reminder: still waiting · " : ""}${a.progress ? a.progress + " · " : ""}${a.needs_other ? a.needs_other + " · " : ""}expires ${new Date(a.expires_at).toLocaleTimeString()}`;
  const actions = document.createElement("div");
  actions.className = "approval-actions";
  const reason = document.createElement("input");
  reason.type = "text";
  reason.placeholder = "Reason for denying (optional)";
  reason.setAttribute("aria-label", "Reason for denying");
  reason.hidden = true;
  const decide = async (verdict) => {
    try {
      await api(`/api/approvals/${a.id}`, { body: { verdict, reason: verdict === "deny" ? reason.value : undefined } });
    } catch (error) {
      meta.textContent = error.message;
    }
    await loadConversation();
  };
  const cap = a.risk === "cap";  // a spending cap reached (core.spending): an admin's Continue or Stop
  const budget = a.risk === "budget" || cap;  // a thread's token budget used up: Continue or Stop
  if (a.risk === "budget") el.querySelector("p").innerHTML = `<strong>Token budget used:</strong> ${escapeHtml(String(a.arguments.used))} of ${escapeHtml(String(a.arguments.budget))} tokens. Continue with ${escapeHtml(String(a.arguments.more))} more, or stop this turn.`;
  if (cap) el.querySelector("p").innerHTML = `<strong>Spending cap reached:</strong> ${escapeHtml(String(a.arguments.cap))} (${escapeHtml(String(a.arguments.amounts))}). Continue lets this turn go on; other turns still stop. Only admins can decide.`;
  const choices = budget ? [["Continue", "approve", ""], ["Stop", "stop", "danger"]] : [["Approve", "approve", ""], ["Deny", "deny", "danger"]];
  if (a.grantable) choices.push(["Always allow", "always", "secondary"]);  // a rule's request only with grant_ttl_s
  if (a.thread_grantable) choices.push(["Allow in this thread", "thread", "secondary"]);  // this conversation only
  for (const [label, verdict, cls] of choices) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    if (cls) button.className = cls;
    button.addEventListener("click", () => {
      if (verdict === "stop") { decide("deny"); return; }
      if (verdict === "deny" && reason.hidden) { reason.hidden = false; reason.focus(); button.textContent = "Deny now"; return; }
      decide(verdict);
    });
    actions.appendChild(button);
  }
  if (a.editable) {  // change the arguments and approve the edited call: core checks it all again
    const box = document.createElement("textarea");
    box.hidden = true;
    box.rows = 6;
    box.value = JSON.stringify(a.arguments, null, 2);
    box.setAttribute("aria-label", "Arguments (JSON)");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = "Edit";
    button.className = "secondary";
    button.addEventListener("click", async () => {
      if (box.hidden) { box.hidden = false; box.focus(); button.textContent = "Approve edited"; return; }
      try {
        await api(`/api/approvals/${a.id}/edit`, { body: { arguments: box.value } });
      } catch (error) {
        meta.textContent = error.message;
        return;
      }
      await loadConversation();
    });
    actions.appendChild(button);
    el.appendChild(box);
  }
  if (a.batch) {  // one model step's calls: each is decided on its own, by core, through its own policy
    for (const [label, verdict, cls] of [["Approve all", "approve", "secondary"], ["Deny all", "deny", "danger"]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = label;
      button.className = cls;
      button.addEventListener("click", async () => {
        try {
          const result = await api(`/api/approvals/${a.id}/all`, { body: { verdict } });
          if (result && result.message) meta.textContent = result.message;
        } catch (error) {
          meta.textContent = error.message;
        }
        await loadConversation();
      });
      actions.appendChild(button);
    }
  }
  el.append(actions, reason, meta);
  return el;
}

// The agent's reason as core.display.shown_reason shows it: one line, every character visible,
// no URL scheme left whole; quoted as code, so it cannot pass for the page's own words.
function shownReason(text) {
  const out = visible(text).replaceAll("\n", " ⏎ ").replace(/([a-z][a-z0-9+.-]*):(?=\/\/)/gi, "$1[:]");
  return out.length > 600 ? `${out.slice(0, 600)}… (${out.length - 600} more characters)` : out;
}

function credentialElement(c) {
  const el = document.createElement("div");
  el.className = `msg approval credential ${c.status}`;
  el.innerHTML = `<p><strong>Credential needed:</strong> <code>${escapeHtml(c.name)}</code> (${escapeHtml(c.scope)} scope)</p>` +
    `<p>Reason given by the agent: <code>${escapeHtml(shownReason(c.reason))}</code></p>`;
  const meta = document.createElement("div");
  meta.className = "meta";
  if (c.status !== "pending") {
    meta.textContent = c.summary;
    el.appendChild(meta);
    return el;
  }
  meta.textContent = `The value is sealed and never shown again · expires ${new Date(c.expires_at).toLocaleTimeString()}`;
  const value = document.createElement("textarea");
  value.rows = 3;
  value.setAttribute("aria-label", `Value for ${c.name}`);
  value.autocomplete = "off";
  const hosts = document.createElement("input");  // optional: where http_request may send it
  hosts.type = "text";
  hosts.autocomplete = "off";
  hosts.placeholder = "Allowed hosts (comma-separated, optional): api.example.com, *.example.com";
  hosts.setAttribute("aria-label", `Allowed hosts for ${c.name} (comma-separated, optional)`);
  const error = document.createElement("p");
  error.className = "error";
  const store = document.createElement("button");
  store.type = "button";
  store.textContent = "Store";
  store.addEventListener("click", async () => {
    try {
      await api(`/api/credentials/${c.id}`, { body: { value: value.value, hosts: hosts.value } });
      value.value = "";
      await loadConversation();
    } catch (e) {
      error.textContent = e.message;
    }
  });
  el.append(value, hosts, error, store, meta);
  return el;
}

// A call waits for an account to be connected: the link mints this browser's own single-use consent link.
function connectionElement(c) {
  const el = document.createElement("div");
  el.className = `msg approval connection ${c.status}`;
  el.innerHTML = `<p><strong>${escapeHtml(c.ask)}</strong></p>`;
  const meta = document.createElement("div");
  meta.className = "meta";
  if (c.status !== "pending") {
    meta.textContent = c.summary;
    el.appendChild(meta);
    return el;
  }
  const link = document.createElement("a");
  link.className = "button";
  link.href = c.connect;
  link.target = "_blank";
  link.rel = "noopener noreferrer";
  link.textContent = `Connect ${c.connection}`;
  meta.textContent = `The agent waits until ${new Date(c.expires_at).toLocaleTimeString()}`;
  el.append(link, meta);
  return el;
}

async function loadConnections() {
  const data = await api("/api/connections");
  const list = $("connections");
  list.innerHTML = "";
  if (!data.connections.length) {
    const li = document.createElement("li");
    li.className = "schedule muted";
    li.textContent = "None yet — you are asked when the agent needs one.";
    list.appendChild(li);
  }
  for (const c of data.connections) {
    const li = document.createElement("li");
    li.className = "schedule";
    li.innerHTML = `<div>${escapeHtml(c.describe)}</div>`;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "danger";
    button.textContent = "Disconnect";
    button.addEventListener("click", async () => {
      try { await api(`/api/connections/${encodeURIComponent(c.name)}/disconnect`, { body: {} }); }
      catch (e) { alert(e.message); }
      await loadConnections();
    });
    li.appendChild(button);
    list.appendChild(li);
  }
}

function renderTranscript(messages, approvals = [], credentials = [], connections = []) {
  const box = $("transcript");
  box.querySelectorAll(".msg").forEach((el) => el.remove());
  $("empty").hidden = messages.length > 0 || state.pending.length > 0;
  const timeline = [...messages.map((m) => ({ kind: "m", at: m.at, m })), ...approvals.map((a) => ({ kind: "a", at: a.at, a })),
    ...credentials.map((c) => ({ kind: "c", at: c.at, c })), ...connections.map((c) => ({ kind: "o", at: c.at, c }))];
  timeline.sort((x, y) => (x.at < y.at ? -1 : x.at > y.at ? 1 : 0));
  for (const item of timeline) {
    if (item.kind === "a") { box.appendChild(approvalElement(item.a)); continue; }
    if (item.kind === "c") { box.appendChild(credentialElement(item.c)); continue; }
    if (item.kind === "o") { box.appendChild(connectionElement(item.c)); continue; }
    const m = item.m;
    if (m.role === "assistant" && !m.content && m.tools.length) {
      box.appendChild(messageElement("notice", escapeHtml(`Used ${m.tools.join(", ")}`)));
      continue;
    }
    const role = m.role === "user" ? "user" : m.role === "notice" ? "notice" : "assistant";
    const meta = m.queued ? "queued — waits for the current turn" : m.tools.length ? `used ${m.tools.join(", ")}` : "";
    const el = messageElement(role, renderMarkdown(m.content || ""), meta, m.queued ? "pending" : "");
    if (role === "assistant" && m.content && !m.tools.length && m.turn) el.appendChild(feedbackElement(m.turn));
    box.appendChild(el);
  }
  for (const text of state.pending) {
    box.appendChild(messageElement("user", renderMarkdown(text), "sending…", "pending"));
  }
  for (const text of state.notices) {
    box.appendChild(messageElement("notice", renderMarkdown(text)));
  }
  showLive();
}

// Under each answer: was it good? (recorded once per answer; a second click replaces the first)
function feedbackElement(turn) {
  const bar = document.createElement("div");
  bar.className = "feedback";
  for (const [verdict, label] of [["positive", "👍 Good answer"], ["negative", "👎 Bad answer"]]) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "secondary";
    button.textContent = label;
    button.addEventListener("click", async () => {
      try {
        const result = await api(`/api/conversations/${state.cid}/feedback`, { body: { turn, verdict } });
        bar.textContent = result.text;
      } catch (error) { bar.textContent = error.message; }
    });
    bar.appendChild(button);
  }
  return bar;
}

// The answer as the model writes it (answer.delta events): one message, replaced by the stored answer
// when the turn ends.
function showLive() {
  const box = $("transcript");
  box.querySelector(".msg.live")?.remove();
  if (state.live && state.live.text) {
    box.appendChild(messageElement("assistant", renderMarkdown(state.live.text), "writing…", "live"));
  }
  box.scrollTop = box.scrollHeight;
}

async function loadConversation() {
  if (!state.cid) return;
  const data = await api(`/api/conversations/${state.cid}`);
  const firstUser = data.messages.find((m) => m.role === "user");
  $("title").textContent = firstUser ? firstUser.content.split("\n")[0].slice(0, 80) : "New conversation";
  renderTranscript(data.messages, data.approvals || [], data.credentials || [], data.connections || []);
  setWorking(data.working, data.working ? "" : $("state").textContent === "Stopped" ? "Stopped" : "");
}

async function loadList() {
  const data = await api("/api/conversations");
  const list = $("conversations");
  list.innerHTML = "";
  for (const c of data.conversations) {
    const li = document.createElement("li");
    const a = document.createElement("a");
    a.href = `/c/${c.id}`;
    a.textContent = c.title;
    if (c.status === "running") {
      const s = document.createElement("span");
      s.className = "status";
      s.textContent = "· working";
      a.appendChild(s);
    }
    if (c.id === state.cid) a.classList.add("active");
    a.addEventListener("click", (event) => { event.preventDefault(); openConversation(c.id, true); });
    li.appendChild(a);
    list.appendChild(li);
  }
}

async function loadSchedules() {
  const data = await api("/api/schedules");
  const list = $("schedules");
  list.innerHTML = "";
  if (!data.schedules.length) {
    const li = document.createElement("li");
    li.className = "schedule muted";
    li.textContent = "None yet — ask the bot to do something on a schedule.";
    list.appendChild(li);
  }
  for (const s of data.schedules) {
    const li = document.createElement("li");
    li.className = "schedule";
    li.innerHTML = `<div><strong>#${s.id}</strong> ${escapeHtml(s.when)} → ${escapeHtml(s.destination)} · <em>${escapeHtml(s.status)}</em></div>` +
      `<div class="meta">${escapeHtml(s.prompt.slice(0, 80))}</div>` +
      `<div class="meta">firings ${s.firings}; last: ${escapeHtml(s.last_outcome || "none yet")}</div>`;
    if (s.can_change) {
      const actions = document.createElement("div");
      actions.className = "approval-actions";
      const choices = s.status === "active" ? ["pause", "cancel"] : s.status === "paused" ? ["resume", "cancel"]
        : s.status === "pending_destination" ? ["cancel"] : [];
      for (const action of choices) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = action === "cancel" ? "danger" : "secondary";
        button.textContent = action[0].toUpperCase() + action.slice(1);
        button.addEventListener("click", async () => { await api(`/api/schedules/${s.id}/${action}`, { body: {} }); await loadSchedules(); });
        actions.appendChild(button);
      }
      li.appendChild(actions);
    }
    list.appendChild(li);
  }
}

function listen() {
  if (state.stream) state.stream.close();
  if (!state.cid) return;
  const stream = new EventSource(`/api/conversations/${state.cid}/events`);
  stream.onmessage = async (event) => {
    const item = JSON.parse(event.data);
    if (item.type === "turn.started") setWorking(true);
    if (item.type === "answer.delta") {
      if (!state.live || state.live.turn !== item.turn_id) state.live = { turn: item.turn_id, text: "" };
      state.live.text += (item.restart && state.live.text ? "\n\n" : "") + item.text;
      showLive();
    }
    if (item.type === "turn.finished" || item.type === "turn.failed" || item.type === "turn.cancelled") {
      state.live = null;
      setWorking(false, item.type === "turn.cancelled" ? "Stopped" : "");
      await loadConversation();
      await loadList();
    }
    if (item.type === "message.accepted" || item.type === "input.queued") await loadConversation();
    if (item.type === "inputs.taken") { setWorking(true, item.steered ? "Taken into the running turn…" : ""); await loadConversation(); }
    if (item.type === "notice") { state.notices.push(item.text); await loadConversation(); }
    if (item.type.startsWith("approval.") || item.type.startsWith("credential.")) await loadConversation();
    if (item.type.startsWith("connection.")) { await loadConversation(); await loadConnections(); }
  };
  state.stream = stream;
}

async function openConversation(cid, push) {
  state.cid = cid;
  state.pending = [];
  state.notices = [];
  if (push) history.pushState({}, "", cid ? `/c/${cid}` : "/");
  $("sidebar").classList.remove("open");
  setWorking(false);
  if (!cid) {
    $("title").textContent = "New conversation";
    renderTranscript([]);
  }
  listen();
  await loadConversation();
  await loadList();
  $("message").focus();
}

async function send(event) {
  event.preventDefault();
  const box = $("message");
  const text = box.value.trim();
  if (!text) return;
  if (!state.cid) {
    state.cid = randomHex(16);
    history.pushState({}, "", `/c/${state.cid}`);
    listen();
  }
  box.value = "";
  state.pending.push(text);
  renderTranscript([]);
  setWorking(true, "Sending…");
  try {
    await api(`/api/conversations/${state.cid}/messages`, { body: { text, client_id: randomHex(12) } });
  } catch (error) {
    setWorking(false, `Not sent: ${error.message}`);
    box.value = text;
  }
  state.pending = state.pending.filter((t) => t !== text);
  await loadConversation();
  await loadList();
}

function cidFromPath() {
  const m = location.pathname.match(/^\/c\/([0-9a-f]{32})$/);
  return m ? m[1] : null;
}

$("composer").addEventListener("submit", send);
$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", async () => {
  if (!state.cid) return;
  await api(`/api/conversations/${state.cid}/stop`, { body: {} });  // the stream brings the notice
  setWorking(false, "Stopped");
});
$("new-conversation").addEventListener("click", () => openConversation(null, true));
$("refresh-schedules").addEventListener("click", () => loadSchedules());
$("refresh-connections").addEventListener("click", () => loadConnections());
$("toggle-sidebar").addEventListener("click", () => $("sidebar").classList.toggle("open"));
window.addEventListener("popstate", () => openConversation(cidFromPath(), false));

openConversation(cidFromPath(), false);
loadSchedules();
loadConnections();
