// The dashboard: tabs.

import { allAgents, updateAgent } from './graph.js';
import { refreshOrganism } from './organism.js';
import { $, state } from './state.js';
import { loadInbox } from './inbox.js';
import { loadThreads } from './threads.js';
import { loadUsage } from './usage.js';

export function selectTab(name) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t.id === 'tab-' + name;
    t.setAttribute('aria-selected', on ? 'true' : 'false');
    $(t.getAttribute('aria-controls')).hidden = !on;
  }
  if (name === 'threads' && !$('thread-list').children.length) loadThreads();
  if (name === 'inbox') loadInbox();
  if (name === 'usage') loadUsage();
}

for (const t of document.querySelectorAll('[role="tab"]')) {
  t.addEventListener('click', () => selectTab(t.id.replace('tab-', '')));
  t.addEventListener('keydown', (ev) => {
    const tabs = [...document.querySelectorAll('[role="tab"]')].filter((x) => !x.hidden);
    const i = tabs.indexOf(t);
    if (ev.key === 'ArrowRight' || ev.key === 'ArrowLeft') {
      const next = tabs[(i + (ev.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length];
      next.focus();
      selectTab(next.id.replace('tab-', ''));
    }
  });
}

// Counters and queue depths are not events: read every 2 s while the page is shown.
setInterval(() => {
  if ($('app').hidden || document.hidden) return;
  refreshOrganism();
  allAgents().then((agents) => {
    const apply = () => { for (const a of agents) updateAgent(a.name, a); };
    if (state.graph) state.graph.batch(apply); else apply();
  }).catch(() => {});
}, 2000);
