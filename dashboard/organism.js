// The dashboard: the organism.

import { api, el, notice } from './api.js';
import { $, state } from './state.js';
import { selectTab } from './tabs.js';

export async function refreshOrganism() {
  try {
    setOrganism(await api('GET', '/organism'));
  } catch (e) {
    // Shown again with the next answer or snapshot.
  }
}

/// The organism's status changed (`organism_state`).
export function setOrganismStatus(status) {
  if (!state.organism) return;
  state.organism.status = status;
  showOrganism();
}

/// What the organism is now (an answer, or a stream's snapshot), shown.
export function setOrganism(o) {
  state.organism = o;
  showOrganism();
}

export function showOrganism() {
  const o = state.organism;
  if (!o) return;
  $('organism-name').textContent = o.name;
  document.title = o.name + ' · agentserver';
  $('organism-status').textContent = o.status;
  $('organism-status').className = 'status-' + o.status;
  $('organism-uptime').textContent = Math.round(o.uptime_seconds) + ' s';
  $('organism-messages').textContent = o.total_messages;
  $('organism-threads').textContent = o.active_threads;
  $('organism-rev').textContent = o.config_rev;
}

for (const b of document.querySelectorAll('[data-organism]')) {
  b.addEventListener('click', async () => {
    const act = b.dataset.organism;
    if (act === 'stop' && !confirm('Stop the organism? The server drains and exits.')) return;
    if (act === 'reload' && !confirm('Reload the organism file?')) return;
    try {
      const r = await api('POST', '/organism/' + act);
      if (act === 'reload') showReload(r, null);
      await refreshOrganism();
    } catch (e) {
      if (act === 'reload') showReload(null, e);
      else notice(`${act} refused: ${e.message}`);
    }
  });
}

export function showReload(r, e) {
  const out = $('reload-result');
  out.replaceChildren();
  if (e) {
    out.append(el('p', { class: 'bad' }, 'Reload refused: ' + e.message));
    const details = (e.body && e.body.details) || [];
    out.append(el('ul', {}, details.map((d) => el('li', {}, d))));
  } else if (r) {
    for (const k of ['added', 'removed', 'changed', 'unchanged']) {
      out.append(el('p', {}, `${k}: ${(r[k] || []).join(', ') || 'none'}`));
    }
  }
  selectTab('organism');
}
