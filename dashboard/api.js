// The dashboard: REST requests to the API, and the small helpers of the page (elements, notices, names, times).

import { signedOut } from './signin.js';
import { $, API, state } from './state.js';

export async function api(method, path, body) {
  const headers = {};
  const token = state.token;
  if (token) headers.Authorization = 'Bearer ' + token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(API + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = text; }
  // Refused: signed out, unless another credential was given meanwhile.
  if (r.status === 401 && token === state.token) {
    signedOut(token ? 'Your credential was refused; sign in again.' : '');
  }
  if (!r.ok) {
    const e = new Error((data && data.error && data.error.message) || r.statusText);
    e.status = r.status;
    e.body = data && data.error;
    throw e;
  }
  return data;
}

export function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c !== undefined && c !== null) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

export function notice(text) {
  const n = $('notice');
  n.textContent = text || '';
  n.hidden = !text;
}

export const CLOCK = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
/// `{namespace}Local` as `Local`.
export function local(type) {
  return (type || '').replace(/^\{[^}]*\}/, '');
}

export function time(ts) {
  return ts ? CLOCK.format(new Date(ts)) : '';
}
