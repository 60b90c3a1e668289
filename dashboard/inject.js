// The dashboard: inject.

import { api, el, local } from './api.js';
import { begin } from './graph.js';
import { $, state } from './state.js';
import { openThread } from './threads.js';

export function fillInjectTargets() {
  const sel = $('inject-to');
  const keep = sel.value;
  sel.replaceChildren(...[...state.agents.values()].map((a) => el('option', { value: a.name }, a.name)));
  if (state.agents.has(keep)) sel.value = keep;
  injectTypes();
}

/// The elements of `type` (one `name` accepts) as a tree, in schema order, as the server
/// reads its schema (`GET /agents/{name}/fields`): each with its name, its XSD type, its
/// JSON kind, whether it is optional or repeated, and its own elements when it has some.
export async function fieldsOf(name, type) {
  const r = await api('GET', `/agents/${encodeURIComponent(name)}/fields?type=${encodeURIComponent(type)}`);
  return r.fields;
}

/// One form control per leaf element (its path in `data-path`), a fieldset per element
/// with elements of its own.
export function fieldControls(fields, prefix) {
  return fields.map((f) => {
    const path = prefix ? prefix + '.' + f.name : f.name;
    const note = `${f.optional ? ' (optional)' : ''}${f.repeated ? ' (repeated)' : ''}`;
    if (f.children) {
      return el('fieldset', { 'data-group': path }, el('legend', {}, f.name + note),
        fieldControls(f.children, path));
    }
    const input = el('input', {
      name: path, 'data-path': path, 'data-repeated': f.repeated ? '1' : undefined,
      type: f.kind === 'number' ? 'number' : 'text',
      step: f.kind === 'number' && /decimal|double|float/.test(f.type) ? 'any' : undefined,
      required: !f.optional && !f.repeated,
      placeholder: f.repeated ? 'values separated by commas' : f.type,
    });
    return el('label', { 'data-label': f.name }, `${f.name}${note} `, input,
      el('span', { class: 'field-error', role: 'alert' }));
  });
}

export async function injectTypes() {
  const name = $('inject-to').value;
  const a = state.agents.get(name);
  const types = (a && a.accepts) || [];
  const sel = $('inject-type');
  sel.replaceChildren(...types.map((t) => el('option', { value: t }, local(t))));
  await injectFields();
}

export async function injectFields() {
  const current = begin('inject-fields');
  const box = $('inject-fields');
  box.replaceChildren(el('legend', {}, 'Fields'));
  const name = $('inject-to').value;
  const type = $('inject-type').value;
  if (!name || !type) return;
  let fields = [];
  try { fields = await fieldsOf(name, type); } catch (_) { return; }
  if (current()) box.append(...fieldControls(fields, ''));
}
$('inject-to').addEventListener('change', injectTypes);
$('inject-type').addEventListener('change', injectFields);

$('inject-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const out = $('inject-result');
  out.replaceChildren();
  for (const s of document.querySelectorAll('.field-error')) s.textContent = '';
  const body = { to: $('inject-to').value };
  const xml = $('inject-xml').value.trim();
  if ($('inject-raw').open && xml) {
    body.payload_xml = xml;
  } else {
    // Nested elements are nested objects, repeated ones arrays.
    const payload = {};
    for (const i of $('inject-fields').querySelectorAll('input[data-path]')) {
      const v = i.value.trim();
      if (!v) continue;
      const keys = i.dataset.path.split('.');
      let at = payload;
      for (const k of keys.slice(0, -1)) at = at[k] = at[k] || {};
      const value = (x) => (i.type === 'number' ? Number(x) : x);
      at[keys[keys.length - 1]] = i.dataset.repeated ? v.split(',').map((x) => value(x.trim())) : value(v);
    }
    body.payload = payload;
    if ($('inject-type').value) body.payload_type = $('inject-type').value;
  }
  const thread = $('inject-thread').value.trim();
  if (thread) body.thread_id = thread;
  try {
    const r = await api('POST', '/inject', body);
    out.append(el('p', {}, 'Injected: thread ', el('button', { type: 'button', class: 'link',
      onclick: () => openThread(r.thread_id) }, r.thread_id)));
    openThread(r.thread_id);
  } catch (e) {
    out.append(el('p', { class: 'bad' }, `${e.status}: ${e.message}`));
    const details = (e.body && e.body.details) || [];
    out.append(el('ul', { class: 'validator' }, details.map((d) => el('li', {}, d))));
    // Each validator message beside the field it names.
    for (const d of details) {
      for (const s of document.querySelectorAll('#inject-fields [data-label]')) {
        if (d.includes(`'${s.dataset.label}'`) || d.includes(`<${s.dataset.label}>`) || d.includes(`{${s.dataset.label}}`)) {
          s.querySelector('.field-error').textContent = d;
        }
      }
    }
  }
});
