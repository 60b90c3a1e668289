// The dashboard: usage and budgets. The credential's account (a tenant's own, an
// organism-wide credential's all) from `GET /usage` (the last 30 days by day, listener and
// model: models' calls, tokens and cost, every listener's messages and time) and
// `GET /usage/budgets` (each token window: limit, used, reserved, remaining, reset); read
// when the tab opens, and again on `usage` events while it is shown.

import { api, el } from './api.js';
import { $ } from './state.js';

let timer = null;

/// Reads the account again if the tab is shown (at most every 2 s, however many calls).
export function refreshUsage() {
  if (timer || $('view-usage').hidden) return;
  timer = setTimeout(() => { timer = null; loadUsage(); }, 2000);
}

const DAY = 86400000;

export async function loadUsage() {
  const from = new Date(Date.now() - 29 * DAY).toISOString().slice(0, 10);
  const status = $('usage-status');
  try {
    const budgets = await api('GET', '/usage/budgets');
    $('budgets').tBodies[0].replaceChildren(...budgets.items.map(budgetRow));
    $('budgets').hidden = !budgets.items.length;
    $('no-budgets').hidden = budgets.items.length > 0;
  } catch (e) {
    $('no-budgets').hidden = false;
    $('no-budgets').textContent = 'Budgets: ' + e.message;
  }
  try {
    const q = new URLSearchParams({ from, group_by: 'day,tenant,listener,model' });
    const usage = await api('GET', '/usage?' + q);
    const rows = usage.items.slice().reverse();
    $('usage').tBodies[0].replaceChildren(...rows.map(usageRow));
    status.textContent = rows.length ? `${rows.length} rows since ${from}` : `nothing since ${from}`;
  } catch (e) {
    $('usage').tBodies[0].replaceChildren();
    status.textContent = e.status === 503 ? 'No usage account: the organism keeps no store.' : 'Usage: ' + e.message;
  }
}

function budgetRow(w) {
  const used = w.limit ? Math.min(100, Math.round(100 * (w.used + w.reserved) / w.limit)) : 0;
  return el('tr', {},
    el('td', {}, w.tenant), el('td', {}, `${w.key.replace('tokens_per_', '')} ${w.period}`),
    el('td', {}, num(w.limit)), el('td', {}, num(w.used)), el('td', {}, num(w.reserved)),
    el('td', {}, num(w.remaining), ' ', el('meter', { min: '0', max: '100', value: String(used), 'aria-label': `${used}% of ${w.key} used` })),
    el('td', {}, w.resets_at.slice(0, 16).replace('T', ' ')));
}

function usageRow(u) {
  return el('tr', {},
    el('td', {}, u.day), el('td', {}, u.tenant || '—'), el('td', {}, u.listener),
    el('td', {}, u.model || '—'), el('td', {}, num(u.calls)),
    el('td', {}, `${num(u.input_tokens)} / ${num(u.output_tokens)}`),
    el('td', {}, u.cost_micros ? (u.cost_micros / 1e6).toFixed(4) : '—'),
    el('td', {}, num(u.messages)), el('td', {}, num(u.handler_ms)), el('td', {}, num(u.cpu_ms)));
}

const NUM = new Intl.NumberFormat();
function num(n) {
  return NUM.format(n || 0);
}
