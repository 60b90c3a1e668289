// The dashboard: threads.

import { setHash } from './address.js';
import { api, el, local, notice, time } from './api.js';
import { $, API, ROLES, state } from './state.js';
import { selectTab } from './tabs.js';

export const PAGE = 25;

export async function loadThreads() {
  const f = new FormData($('thread-filters'));
  const id = String(f.get('id') || '').trim();
  if (id) { openThread(id); return; }
  const q = new URLSearchParams({ limit: String(PAGE), offset: String(state.threadPage * PAGE) });
  const status = String(f.get('status') || '');
  const agent = String(f.get('agent') || '').trim();
  const text = String(f.get('q') || '').trim();
  if (status) q.set('status', status);
  if (agent) q.set('agent', agent);
  if (text) q.set('q', text);
  for (const l of state.labelFilters) q.append('label', l);
  try {
    const page = await api('GET', '/threads?' + q);
    $('thread-list').replaceChildren(...page.items.map((t) => el('li', {},
      el('input', { type: 'checkbox', 'data-select': t.id, 'aria-label': 'select thread ' + t.id,
        hidden: !mayOperate() }),
      el('button', { type: 'button', class: 'link thread-' + t.status, 'data-thread': t.id,
        onclick: () => openThread(t.id) }, t.id),
      ` ${t.status}${t.paused ? ' (paused)' : ''} · ${t.message_count} messages · ${(t.participants || []).join(', ')}`,
      labelsText(t.labels))));
    const last = Math.max(0, Math.ceil(page.total / PAGE) - 1);
    $('threads-page').textContent = `page ${state.threadPage + 1} of ${last + 1} (${page.total} threads)`;
  } catch (e) {
    notice('Threads: ' + e.message);
  }
}

/// The list again from its first page (a filter changed).
export function searchAgain() {
  state.threadPage = 0;
  loadThreads();
}

$('thread-filters').addEventListener('submit', (ev) => { ev.preventDefault(); state.threadPage = 0; loadThreads(); });
$('threads-prev').addEventListener('click', () => { state.threadPage = Math.max(0, state.threadPage - 1); loadThreads(); });
$('threads-next').addEventListener('click', () => { state.threadPage += 1; loadThreads(); });

/// Whether the credential may act on threads (an operator or more).
export function mayOperate() {
  return ROLES.indexOf(state.me?.role) >= ROLES.indexOf('operator');
}

function labelsText(labels) {
  const shown = Object.entries(labels || {}).filter(([k]) => !k.startsWith('agentserver.'));
  return shown.length ? ' · ' + shown.map(([k, v]) => `${k}:${v}`).join(', ') : '';
}

export let threadTimer = null;
export function openThread(id, message) {
  // A thread newly opened is the address; one redrawn as it grows leaves it as it is.
  if (id !== state.thread) setHash('#/threads/' + encodeURIComponent(id));
  // Many events for one thread come at once: draw it once for them.
  if (id !== state.thread) state.focus = null;
  if (message) state.focus = message;
  state.thread = id;
  if (threadTimer) return;
  threadTimer = setTimeout(() => { threadTimer = null; drawThread(state.thread); }, 100);
}

// The thread shown follows its event stream (`/threads/{id}/events`): its history, then
// every change, so nothing is fetched again per event; after a break (a restart, the
// network) it resumes from the last `seq` seen, or starts again from a fresh snapshot.
let follow = null;

export function drawThread(id) {
  selectTab('threads');
  if (follow && follow.id === id) { render(follow); return; }
  if (follow) follow.es?.close();
  follow = { id, es: null, messages: new Map(), streaming: new Map(), thread: null, seq: null, shown: false };
  connect(follow);
}

async function connect(f) {
  let url = API + '/threads/' + encodeURIComponent(f.id) + '/events';
  try {
    // A browser's EventSource cannot send the key: a single-use token for this stream.
    if (state.token) url = (await api('POST', '/stream-tokens', { thread_id: f.id })).url;
  } catch (e) {
    if (follow === f) failed(f, e.message);
    return;
  }
  if (follow !== f) return;
  if (f.seq !== null) url += (url.includes('?') ? '&' : '?') + 'since=' + f.seq;
  const es = new EventSource(url);
  f.es = es;
  const on = (kind, apply) => es.addEventListener(kind, (e) => {
    if (follow !== f) return;
    const d = JSON.parse(e.data);
    apply(d);
    if (kind !== 'thread_snapshot' || !d.more) render(f);
  });
  on('thread_snapshot', (d) => {
    if (d.part === 0) { f.messages = new Map(); if (d.thread) f.thread = d.thread; }
    for (const m of d.messages) f.messages.set(m.id, m);
    if (!d.more) f.seq = d.as_of_seq;
  });
  // A model's answer as it streams (`delta`): shown until the message it ends in comes.
  on('delta', (d) => {
    const key = d.in_reply_to + ' ' + d.kind;
    const s = f.streaming.get(key) || { agent: d.agent, kind: d.kind, of: d.in_reply_to, text: '' };
    s.text += d.delta;
    f.streaming.set(key, s);
    f.seq = d.seq;
  });
  on('message', (d) => {
    for (const [key, s] of f.streaming) {
      if (s.of === d.message.parent_id && s.agent === d.message.from) f.streaming.delete(key);
    }
    f.messages.set(d.message.id, d.message);
    if (f.thread) f.thread.message_count = Math.max(f.thread.message_count, d.message.slot_index + 1);
    f.seq = d.seq;
  });
  on('message_status', (d) => {
    const m = f.messages.get(d.id);
    if (m) { m.status = d.status; m.error = d.error; }
    // The message handled is done: whatever streamed for it is in what it sent.
    if (d.status !== 'pending' && d.status !== 'held') {
      for (const [key, s] of f.streaming) if (s.of === d.id) f.streaming.delete(key);
    }
    f.seq = d.seq;
  });
  on('thread_updated', (d) => {
    if (f.thread) Object.assign(f.thread, { status: d.status, message_count: d.message_count, error: d.error, paused: !!d.paused });
    f.seq = d.seq;
  });
  // What a rewind superseded is kept, greyed.
  on('thread_rewound', (d) => {
    for (const m of f.messages.values()) {
      if (m.slot_index > d.after && m.slot_index < d.before) m.superseded = true;
    }
    f.seq = d.seq;
  });
  es.onerror = () => {
    es.close();
    if (follow !== f) return;
    // Not there (or not this credential's): say so; else try again in a moment.
    fetchThread(f).then((ok) => { if (ok) setTimeout(() => { if (follow === f) connect(f); }, 1000); });
  };
}

/// Whether the thread can be read now (else what was wrong is shown).
async function fetchThread(f) {
  try { await api('GET', '/threads/' + encodeURIComponent(f.id)); return true; }
  catch (e) { if (follow === f) failed(f, e.message); return e.status !== 404 && e.status !== 401 && e.status !== 403; }
}

function failed(f, why) {
  $('thread').hidden = false;
  $('thread-title').textContent = 'Thread ' + f.id;
  $('thread-facts').textContent = why;
  if (!f.shown) {
    $('thread-tree').replaceChildren();
    $('thread-timeline').replaceChildren();
  }
}

function render(f) {
  const t = f.thread || { id: f.id, status: 'active', message_count: f.messages.size };
  f.shown = true;
  $('thread').hidden = false;
  $('thread-title').textContent = 'Thread ' + t.id;
  const from = t.forked_from ? ` · forked from ${t.forked_from.thread}` : '';
  $('thread-facts').textContent = `${t.status}${t.paused ? ' (paused)' : ''} · ${t.message_count} messages${t.error ? ' · ' + t.error : ''}${from}`;
  $('thread-kill').disabled = t.status === 'killed';
  $('thread-abort').disabled = !['active', 'waiting'].includes(t.status);
  const msgs = [...f.messages.values()].sort((a, b) => a.slot_index - b.slot_index);
  const children = new Map();
  for (const m of msgs) {
    const p = m.parent_id || '';
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(m);
  }
  const ids = new Set(msgs.map((m) => m.id));
  const branch = (m) => el('li', {}, messageText(m),
    children.has(m.id) ? el('ul', {}, children.get(m.id).map(branch)) : null);
  const roots = msgs.filter((m) => !m.parent_id || !ids.has(m.parent_id));
  $('thread-tree').replaceChildren(...roots.map(branch));
  const streaming = [...f.streaming.values()].map((s) =>
    el('li', { class: 'streaming', 'aria-live': 'polite' },
      el('span', {}, `${s.agent} ${s.kind === 'thinking' ? 'thinks' : 'writes'}: `),
      el('span', { class: 'streamed' }, s.text)));
  $('thread-timeline').replaceChildren(
    ...msgs.map((m) => el('li', {}, `${time(m.timestamp)} `, messageText(m))), ...streaming);
}

const RETRIED = ['failed', 'rejected', 'undeliverable', 'killed'];

export function messageText(m) {
  const type = local(m.payload_type);
  const acts = mayOperate() && state.thread ? [
    el('button', { type: 'button', 'data-fork': m.id, onclick: () => forkAt(m) }, 'Fork from here'),
    RETRIED.includes(m.status)
      ? el('button', { type: 'button', 'data-retry': m.id, onclick: () => retry(m) }, 'Retry') : null,
  ] : [];
  const superseded = m.superseded ? ' (superseded)' : '';
  return el('details', { class: `status-${m.status}${m.superseded ? ' superseded' : ''}`, 'data-message': m.id, open: state.focus === m.id },
    el('summary', {}, `${m.from} → ${m.to || '—'} ${type} [${m.status}]${superseded}${m.error ? ' ' + m.error : ''}`),
    el('pre', { 'aria-label': 'payload as JSON' }, JSON.stringify(m.payload, null, 2)),
    el('pre', { 'aria-label': 'payload as XML' }, m.payload_xml || ''),
    acts.length ? el('p', { class: 'message-acts' }, acts) : null);
}

/// A new thread from this message on: its payload as it was, or as edited here.
async function forkAt(m) {
  const edited = prompt('Fork from here: the payload it runs with (XML)', m.payload_xml || '');
  if (edited === null) return;
  const body = { at: m.id };
  if (edited !== m.payload_xml) body.payload_xml = edited;
  try {
    const f = await api('POST', `/threads/${encodeURIComponent(m.thread_id)}/fork`, body);
    openThread(f.thread_id);
  } catch (e) { notice('Fork refused: ' + e.message); }
}

async function retry(m) {
  try {
    await api('POST', `/messages/${encodeURIComponent(m.id)}/retry`, {});
    openThread(m.thread_id);
  } catch (e) { notice('Retry refused: ' + e.message); }
}

$('thread-abort').addEventListener('click', async () => {
  if (!state.thread || !confirm('Abort this thread? Its work stops; the thread stays usable.')) return;
  try { await api('POST', `/threads/${encodeURIComponent(state.thread)}/abort`, { reason: 'from the dashboard' }); openThread(state.thread); }
  catch (e) { notice('Abort refused: ' + e.message); }
});

$('thread-kill').addEventListener('click', async () => {
  if (!state.thread || !confirm('Kill this thread?')) return;
  try { await api('POST', `/threads/${encodeURIComponent(state.thread)}/kill`); openThread(state.thread); }
  catch (e) { notice('Kill refused: ' + e.message); }
});
