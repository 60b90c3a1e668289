// The dashboard: the inbox. Messages held at approval gates (approve, edit, reject) and
// questions to people (answer), from `GET /inputs`, kept live by the stream's
// `input_requested` and `input_resolved` events.

import { api, el, local, notice, time } from './api.js';
import { $, state } from './state.js';

let timer = null;

/// Reads the inbox again (at most every 200 ms, however many events ask).
export function refreshInbox() {
  if (timer) return;
  timer = setTimeout(() => { timer = null; loadInbox(); }, 200);
}

export async function loadInbox() {
  const status = String(new FormData($('inbox-filters')).get('status') || 'open');
  const q = new URLSearchParams({ limit: '100' });
  if (status !== 'all') q.set('status', status);
  try {
    const page = await api('GET', '/inputs?' + q);
    $('inbox-list').replaceChildren(...page.items.map(item));
    $('inbox-count').textContent = `${page.items.length} of ${page.total}`;
    const open = status === 'open' ? page.total : null;
    if (open !== null) $('tab-inbox').textContent = open ? `Inbox (${open})` : 'Inbox';
  } catch (e) {
    notice('Inbox: ' + e.message);
  }
}

async function decide(input, verb, body, result) {
  try {
    const r = await api('POST', `/inputs/${encodeURIComponent(input.id)}/${verb}`, body);
    result.textContent = `${r.status}${r.decision ? ' (' + r.decision + ')' : ''}`;
    refreshInbox();
  } catch (e) {
    result.textContent = `${verb} refused: ${e.message}`;
    for (const d of (e.body && e.body.details) || []) result.append(el('br'), d);
  }
}

function item(input) {
  const result = el('div', { role: 'status', class: 'inbox-result' });
  const reason = el('input', { 'aria-label': 'Reason', placeholder: 'reason (optional)' });
  const why = () => reason.value.trim() || undefined;
  const may = state.me && ['operator', 'admin'].includes(state.me.role);
  const open = input.status === 'open' && may;
  const allow = new Set(input.allow || []);
  const controls = [];
  if (open && input.kind === 'approval') {
    const edited = el('textarea', { rows: 3, cols: 50, 'aria-label': 'Edited payload (XML)' }, input.payload_xml);
    if (allow.has('approve')) controls.push(el('button', { type: 'button', class: 'approve',
      onclick: () => decide(input, 'approve', { reason: why() }, result) }, 'Approve'));
    if (allow.has('reject')) controls.push(el('button', { type: 'button', class: 'danger reject',
      onclick: () => decide(input, 'reject', { reason: why() }, result) }, 'Reject'));
    if (allow.has('edit')) controls.push(el('details', { class: 'edit' }, el('summary', {}, 'Edit'),
      edited, el('button', { type: 'button', class: 'approve-edited',
        onclick: () => decide(input, 'approve', { reason: why(), payload_xml: edited.value }, result) },
      'Approve edited')));
  }
  if (open && input.kind === 'question') {
    const answer = el('textarea', { rows: 3, cols: 50, 'aria-label': 'Answer (payload XML)' });
    const to = el('input', { 'aria-label': 'Answer to (listener, optional)', placeholder: 'to (optional)' });
    controls.push(answer, to, el('button', { type: 'button', class: 'answer',
      onclick: () => decide(input, 'answer',
        { payload_xml: answer.value, to: to.value.trim() || undefined, reason: why() }, result) }, 'Answer'));
  }
  if (controls.length) controls.unshift(reason);
  const decided = input.decided_by
    ? ` · ${input.decision || input.status} by ${input.decided_by}${input.reason ? ': ' + input.reason : ''}`
    : '';
  return el('li', { class: 'input input-' + input.status, 'data-input': input.id },
    el('p', {}, el('strong', {}, input.prompt || `${input.from} → ${input.listener} ${local(input.payload_type)}`),
      ` · ${input.kind} · ${input.status} · ${time(input.created_at)}`,
      input.expires_at && input.status === 'open' ? ` · until ${new Date(input.expires_at).toLocaleString()}` : '',
      decided, ' · thread ',
      el('a', { href: '#/threads/' + encodeURIComponent(input.thread_id) }, input.thread_id.slice(0, 13))),
    el('pre', { 'aria-label': 'held payload as JSON' }, JSON.stringify(input.payload, null, 2)),
    controls.length ? el('div', { class: 'controls' }, controls) : null,
    result);
}

$('inbox-filters').addEventListener('change', loadInbox);
