// The dashboard: the threads' label chips and batch actions. A label typed as `key:value`
// becomes a chip (a filter of the search, removed by its button); threads ticked in the
// list take one action together, after the operator types how many there are, which the
// server checks again (`expected_count`: another count changes nothing).

import { api, el, notice } from './api.js';
import { $, state } from './state.js';
import { loadThreads, searchAgain } from './threads.js';

function drawChips() {
  $('label-chips').replaceChildren(...state.labelFilters.map((l) =>
    el('button', { type: 'button', class: 'chip', 'data-chip': l, 'aria-label': `remove label filter ${l}`,
      onclick: () => { state.labelFilters = state.labelFilters.filter((x) => x !== l); drawChips(); searchAgain(); } },
    `${l} ×`)));
}

$('label-add').addEventListener('click', () => {
  const input = $('thread-filters').elements.namedItem('label');
  const l = input.value.trim();
  if (!/^[a-z0-9_.-]{1,64}:.+$/.test(l)) { notice('A label filter is key:value (key of a-z 0-9 _ . -)'); return; }
  if (!state.labelFilters.includes(l)) state.labelFilters.push(l);
  input.value = '';
  notice('');
  drawChips();
  searchAgain();
});

const selected = () => [...document.querySelectorAll('#thread-list [data-select]:checked')].map((c) => c.dataset.select);

$('batch-all').addEventListener('click', () => {
  for (const c of document.querySelectorAll('#thread-list [data-select]')) c.checked = true;
});

$('batch-apply').addEventListener('click', () => {
  const ids = selected();
  if (!ids.length) { $('batch-result').textContent = 'Select threads first.'; return; }
  $('batch-count').textContent = String(ids.length);
  $('batch-typed').value = '';
  $('batch-confirm').hidden = false;
  $('batch-typed').focus();
});

$('batch-cancel').addEventListener('click', () => { $('batch-confirm').hidden = true; });

$('batch-go').addEventListener('click', async () => {
  const ids = selected();
  const typed = $('batch-typed').value.trim();
  if (typed !== String(ids.length)) {
    $('batch-result').textContent = `Type ${ids.length} to confirm.`;
    return;
  }
  const action = $('batch-action').value;
  try {
    const done = await api('POST', '/threads/batch', {
      action, filter: {}, ids, expected_count: ids.length, reason: 'from the dashboard',
    });
    $('batch-result').textContent = `${action}: ${done.applied} of ${done.matched} done` +
      (done.skipped.length ? `, ${done.skipped.length} skipped (${done.skipped[0].why})` : '');
    $('batch-confirm').hidden = true;
    loadThreads();
  } catch (e) {
    $('batch-result').textContent = 'Refused: ' + e.message;
  }
});
