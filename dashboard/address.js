// The dashboard: addresses: #/agents/NAME and #/threads/ID can be shared and reloaded.

import { api, el } from './api.js';
import { begin, rememberAgent } from './graph.js';
import { $, API, state } from './state.js';
import { openThread } from './threads.js';

export function setHash(hash) {
  if (location.hash !== hash) history.replaceState(null, '', hash);
}

export function followHash() {
  const [, kind, id] = location.hash.match(/^#\/(agents|threads)\/(.+)$/) || [];
  if (!id) return;
  const name = decodeURIComponent(id);
  if (kind === 'agents') selectAgent(name);
  else openThread(name);
}
window.addEventListener('hashchange', followHash);

export async function selectAgent(name) {
  const current = begin('agent');
  setHash('#/agents/' + encodeURIComponent(name));
  state.selected = name;
  $('agent-panel').hidden = false;
  $('agent-title').textContent = name;
  $('agent-result').textContent = '';
  if (state.graph) {
    state.graph.$(':selected').unselect();
    state.graph.getElementById(name).select();
  }
  try {
    const a = await api('GET', '/agents/' + encodeURIComponent(name));
    rememberAgent(name, a);
    if (current()) showAgentFacts(a);
  } catch (e) { if (current()) $('agent-result').textContent = e.message; }
  const show = (id) => (text) => { if (current()) $(id).textContent = text; };
  await Promise.all([
    api('GET', `/agents/${encodeURIComponent(name)}/config`)
      .then((c) => c.yaml, (e) => e.message)
      .then(show('agent-config')),
    schemaOf(name).catch((e) => e.message).then(show('agent-schema')),
  ]);
}

// A duration in milliseconds for people: two significant digits below 1, one decimal below
// 100, whole above.
export function roundMs(v) {
  if (typeof v !== 'number') return v;
  if (v === 0) return '0';
  if (v < 1) return v.toPrecision(2);
  return v < 100 ? v.toFixed(1) : v.toFixed(0);
}

export function showAgentFacts(a) {
  const facts = [
    ['description', a.description], ['kind', a.kind], ['state', a.state],
    ['accepts', (a.accepts || []).join(', ')], ['peers', (a.peers || []).join(', ')],
    ['queue', a.queue_depth], ['handled', a.handled], ['errors', a.errors],
    ['mean handler ms', roundMs(a.mean_handler_ms)], ['p99 handler ms', roundMs(a.p99_handler_ms)],
  ];
  $('agent-facts').replaceChildren(...facts.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v ?? '')]));
}

for (const b of document.querySelectorAll('[data-agent-act]')) {
  b.addEventListener('click', async () => {
    const name = state.selected;
    if (!name) return;
    try {
      await api('POST', `/agents/${encodeURIComponent(name)}/${b.dataset.agentAct}`);
      $('agent-result').textContent = `${b.dataset.agentAct}: done`;
    } catch (e) {
      $('agent-result').textContent = `${b.dataset.agentAct} refused: ${e.message}`;
    }
  });
}

export async function schemaOf(name) {
  const headers = state.token ? { Authorization: 'Bearer ' + state.token } : {};
  const r = await fetch(`${API}/agents/${encodeURIComponent(name)}/schema`, { headers });
  if (!r.ok) throw new Error('schema: ' + r.status);
  return r.text();
}
