// The dashboard: the message log.

import { api, el, local, notice, time } from './api.js';
import { flow, noteSource, renderGraph } from './graph.js';
import { $, MAX_ROWS, state } from './state.js';
import { openThread } from './threads.js';

export function globToRegExp(g) {
  return new RegExp('^' + g.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.') + '$');
}

export function messageFilter() {
  const f = new FormData($('message-filters'));
  const agents = String(f.get('agents') || '').split(',').map((s) => s.trim()).filter(Boolean).map(globToRegExp);
  return {
    agents,
    thread: String(f.get('thread') || '').trim(),
    type: String(f.get('type') || '').trim(),
    status: String(f.get('status') || ''),
  };
}

export function matches(m, f) {
  if (f.agents.length && !f.agents.some((r) => r.test(m.from) || (m.to && r.test(m.to)))) return false;
  if (f.thread && m.thread_id !== f.thread) return false;
  if (f.type && !(m.payload_type === f.type || (m.payload_type || '').endsWith('}' + f.type))) return false;
  if (f.status && m.status !== f.status) return false;
  return true;
}

export function messageRow(m) {
  const type = local(m.payload_type);
  return el('tr', { 'data-id': m.id, class: 'status-' + m.status },
    el('td', {}, time(m.timestamp)),
    el('td', {}, m.from), el('td', {}, m.to || ''), el('td', {}, type),
    el('td', { class: 'status' }, m.status),
    el('td', {}, el('button', { type: 'button', class: 'link', title: m.thread_id, onclick: () => openThread(m.thread_id, m.id) }, m.thread_id)));
}

export function onMessage(m) {
  const refused = ['rejected', 'undeliverable', 'failed'].includes(m.status);
  if (m.to) flow(m.from, m.to, local(m.payload_type), refused);
  if (state.thread === m.thread_id) openThread(m.thread_id);
  if (!matches(m, messageFilter())) return;
  if (state.frozen) {
    state.held.push(m);
    if (state.held.length > MAX_ROWS) state.held.shift();
    $('frozen-count').textContent = `${state.held.length} new while frozen`;
    return;
  }
  if (state.logById.has(m.id)) return;
  state.pendingRows.push(m);
  if (state.pendingRows.length > MAX_ROWS) state.pendingRows.shift();
}

/// Height of one row of the log (app.css), which the virtual list counts in.
export const ROW_PX = 28;

export function clearLog() {
  state.log = [];
  state.logById.clear();
  state.rows.clear();
  state.pendingRows = [];
  $('messages').tBodies[0].replaceChildren();
}

/// Adds the messages that came since the last draw at once, newest first, keeps MAX_ROWS,
/// and draws the rows in view. A reader scrolled down keeps their place.
export function flushRows() {
  if (!state.pendingRows.length) return;
  const fresh = [];
  for (const m of state.pendingRows.reverse()) {
    if (state.logById.has(m.id)) continue;
    state.logById.set(m.id, m);
    fresh.push(m);
  }
  state.pendingRows = [];
  state.log = fresh.concat(state.log);
  for (const m of state.log.splice(MAX_ROWS)) state.logById.delete(m.id);
  const box = $('log');
  if (box.scrollTop > 0) box.scrollTop += fresh.length * ROW_PX;
  renderLog();
}

/// Older messages go below what is shown.
export function appendLog(messages) {
  for (const m of messages) {
    if (state.logById.has(m.id) || state.log.length >= MAX_ROWS) continue;
    state.logById.set(m.id, m);
    state.log.push(m);
  }
  renderLog();
}

/// Draws the rows in view (and a few either side) between two spacers as tall as the rows
/// they stand for.
export function renderLog() {
  const box = $('log');
  const first = Math.max(0, Math.floor(box.scrollTop / ROW_PX) - 5);
  const last = Math.min(state.log.length, first + Math.ceil(box.clientHeight / ROW_PX) + 10);
  const spacer = (n) => {
    const tr = el('tr', { class: 'spacer', 'aria-hidden': 'true' });
    tr.style.height = n * ROW_PX + 'px';
    return tr;
  };
  const rows = document.createDocumentFragment();
  state.rows.clear();
  if (first > 0) rows.append(spacer(first));
  for (let i = first; i < last; i++) {
    const row = messageRow(state.log[i]);
    state.rows.set(state.log[i].id, row);
    rows.append(row);
  }
  if (last < state.log.length) rows.append(spacer(state.log.length - last));
  $('messages').tBodies[0].replaceChildren(rows);
}

export let logScroll = false;
$('log').addEventListener('scroll', () => {
  if (logScroll) return;
  logScroll = true;
  requestAnimationFrame(() => { logScroll = false; renderLog(); });
});

export function onStatus(f) {
  if (['rejected', 'undeliverable', 'failed'].includes(f.status) && f.to) flow(f.from, f.to, '', true);
  const row = state.rows.get(f.id);
  const logged = state.logById.get(f.id) || state.pendingRows.find((m) => m.id === f.id);
  if (logged) logged.status = f.status;
  if (row) {
    row.className = 'status-' + f.status;
    row.querySelector('.status').textContent = f.status;
  }
  for (const m of state.held) if (m.id === f.id) m.status = f.status;
  if (state.thread === f.thread_id) openThread(f.thread_id);
}

$('freeze').addEventListener('click', () => {
  state.frozen = !state.frozen;
  $('freeze').textContent = state.frozen ? 'Resume' : 'Freeze';
  if (!state.frozen) {
    const held = state.held;
    state.held = [];
    $('frozen-count').textContent = '';
    for (const m of held) onMessage(m);
    flushRows();
  }
});

$('message-filters').addEventListener('change', () => {
  clearLog();
  loadOlder();
});
$('message-filters').addEventListener('submit', (ev) => ev.preventDefault());

export async function loadOlder() {
  const f = new FormData($('message-filters'));
  const q = new URLSearchParams();
  const agents = String(f.get('agents') || '').trim();
  if (agents && !/[*?,]/.test(agents)) q.set('agent', agents);
  for (const [k, name] of [['thread', 'thread'], ['type', 'payload_type'], ['status', 'status']]) {
    const v = String(f.get(k) || '').trim();
    if (v) q.set(name, v);
  }
  try {
    q.set('limit', '1');
    const head = await api('GET', '/messages?' + q);
    const total = head.total;
    const shown = state.log.length;
    // The newest `limit` before those shown; a page the server cut by bytes serves fewer,
    // the oldest of the window, so ask again for the newest that many.
    let limit = Math.min(100, Math.max(0, total - shown));
    let page;
    for (;;) {
      q.set('limit', String(limit));
      q.set('offset', String(Math.max(0, total - shown - limit)));
      page = await api('GET', '/messages?' + q);
      if (page.items.length >= limit || page.items.length === 0) break;
      limit = page.items.length;
    }
    const filter = messageFilter();
    const older = page.items.slice().reverse();
    for (const m of older) if (m.to) noteSource(m.from, m.to);
    appendLog(older.filter((m) => matches(m, filter)));
    if (state.graphStale) renderGraph();
  } catch (e) {
    notice('Older messages: ' + e.message);
  }
}
$('older').addEventListener('click', loadOlder);
