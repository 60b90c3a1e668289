// The dashboard: signing in.

import { followHash } from './address.js';
import { api, notice } from './api.js';
import { clearLog } from './log.js';
import { refreshOrganism } from './organism.js';
import { $, ROLES, forgetAll, state } from './state.js';
import { connect, setConnection } from './stream.js';

export function signedOut(why) {
  state.token = '';
  sessionStorage.removeItem('agentserver-token');
  reset();
  $('app').hidden = true;
  $('loading').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = why || '';
}

/// Forgets everything a credential was shown: the stream, what it said, the views.
export function reset() {
  const ws = state.ws;
  forgetAll();
  if (ws) ws.close();
  clearLog();
  $('agent-list').replaceChildren();
  $('thread-list').replaceChildren();
  $('thread').hidden = true;
  $('agent-panel').hidden = true;
  $('organism-events').replaceChildren();
  $('who-text').textContent = '';
  // Signed out, no control is offered: a role shows them again once known.
  for (const e of document.querySelectorAll('[data-need]')) e.hidden = true;
  setConnection('signed out');
}

export async function start() {
  const token = state.token;
  // The server marks the page when it asks for a credential: with none yet, the form
  // shows at once (a request without one would only be refused).
  if (!token && document.documentElement.dataset.auth === 'required') {
    signedOut('');
    return;
  }
  let me;
  try {
    me = await api('GET', '/me');
  } catch (e) {
    if (e.status === 401) return; // signedOut has shown the form
    notice('Cannot reach the server: ' + e.message);
    setTimeout(start, 2000);
    return;
  }
  if (token !== state.token) return; // another sign-in began meanwhile
  state.me = me;
  $('loading').hidden = true;
  $('login').hidden = true;
  $('app').hidden = false;
  const m = state.me;
  $('who-text').textContent = m.auth
    ? `${m.name} · ${m.role}${m.tenant ? ' · tenant ' + m.tenant : ''}`
    : 'no authentication · admin';
  $('sign-out').hidden = !m.auth;
  applyRole();
  await refreshOrganism();
  connect();
  followHash();
}

/// Hides what the role may not do: [data-need] is the least role; organism-wide controls
/// are not a tenant's.
export function applyRole() {
  const have = ROLES.indexOf(state.me.role);
  for (const e of document.querySelectorAll('[data-need]')) {
    const need = ROLES.indexOf(e.dataset.need);
    e.hidden = have < need || (e.hasAttribute('data-organism-wide') && !!state.me.tenant);
  }
}

$('login-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.token = $('token').value.trim();
  $('token').value = '';
  sessionStorage.setItem('agentserver-token', state.token);
  start();
});
$('sign-out').addEventListener('click', () => signedOut(''));
