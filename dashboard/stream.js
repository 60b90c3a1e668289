// The dashboard: the event stream.

import { refreshInbox } from './inbox.js';
import { api, el } from './api.js';
import { allAgents, newFrame, renderGraph, setAgents, updateAgent } from './graph.js';
import { flushRows, loadOlder, onMessage, onStatus } from './log.js';
import { refreshOrganism, setOrganism, setOrganismStatus } from './organism.js';
import { $, state } from './state.js';
import { loadThreads, openThread } from './threads.js';
import { refreshUsage } from './usage.js';

export function connect() {
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const since = state.lastSeq ? '?since=' + state.lastSeq : '';
  const ws = new WebSocket(`${proto}//${location.host}/ws${since}`);
  state.ws = ws;
  setConnection(state.lastSeq ? 'resuming' : 'connecting');
  ws.onopen = () => {
    if (state.me.auth) ws.send(JSON.stringify({ cmd: 'auth', token: state.token }));
    // Its answer says the session is up (a resume sends no snapshot, and perhaps no event).
    // Agent states at most every 100 ms, messages past 500 a second folded (counted).
    ws.send(JSON.stringify({ cmd: 'subscribe', request_id: 'hello', coalesce_ms: 100, max_messages_per_s: 500 }));
  };
  ws.onmessage = (m) => {
    let f;
    try { f = JSON.parse(m.data); } catch (_) { return; }
    receive(f);
  };
  ws.onclose = (ev) => {
    if (state.ws !== ws) return;
    setConnection('reconnecting');
    if (ev.code === 4401) {
      // Refused: signed out if the credential is (api() sees the 401), else try again (a
      // first frame that came too late on a busy machine, say).
      api('GET', '/me').catch(() => {});
    }
    state.retry = Math.min(state.retry + 1, 6);
    setTimeout(connect, 250 * 2 ** state.retry);
  };
}

export function setConnection(s) {
  $('connection-state').textContent = s;
  $('connection').className = 'conn-' + s;
}

/// Frames wait for the next animation frame and are drawn together: however fast they
/// come, the page changes once a frame. The inbox is bounded: past INBOX frames (a hidden
/// tab draws nothing), the oldest messages are dropped and counted, never the rest.
export const INBOX = 5000;
export function receive(f) {
  if (typeof f.seq === 'number' && f.seq > state.lastSeq) state.lastSeq = f.seq;
  state.inbox.push(f);
  if (state.inbox.length > INBOX) {
    const i = state.inbox.findIndex((x) => x.event === 'message' || x.event === 'message_status');
    state.inbox.splice(i < 0 ? 0 : i, 1);
    state.dropped += 1;
  }
  if (!state.drawing) {
    state.drawing = true;
    requestAnimationFrame(draw);
    // A hidden tab gets no animation frames: draw at least every second.
    setTimeout(draw, 1000);
  }
}

export function draw() {
  if (!state.drawing) return;
  state.drawing = false;
  const frames = state.inbox;
  state.inbox = [];
  newFrame();
  // The newest state of each agent wins within a frame.
  const states = new Map();
  // The canvas redraws once for all the frame's changes.
  const batch = (fn) => (state.graph ? state.graph.batch(fn) : fn());
  batch(() => {
    for (const f of frames) {
      if (f.event === 'agent_state') states.set(f.agent, f);
      else if (f.event === 'agent_states') for (const a of f.states || []) states.set(a.agent, a);
      else onFrame(f);
    }
    for (const f of states.values()) updateAgent(f.agent, { state: f.state, current_thread: f.current_thread });
  });
  if (state.graphStale) renderGraph();
  flushRows();
  $('last-seq').textContent = state.lastSeq;
  $('dropped').textContent = state.dropped;
  $('folded').textContent = state.folded;
}

export function onFrame(f) {
  switch (f.event) {
    case 'connected':
      state.retry = 0;
      setConnection('live');
      if (f.organism) setOrganism(f.organism);
      if (f.agents) setAgents(f.agents);
      else allAgents().then(setAgents).catch(() => {});
      if (f.threads && !$('view-threads').hidden) loadThreads();
      // The inbox's count shows on its tab whatever view is open.
      refreshInbox();
      // The log opens on the latest page of what came before.
      if (!state.log.length) loadOlder();
      break;
    case 'ack':
      if (f.request_id === 'hello') { state.retry = 0; setConnection('live'); }
      break;
    case 'resync_required':
      setConnection('resyncing');
      break;
    case 'dropped':
      state.dropped += f.count || 0;
      break;
    case 'folded':
      state.folded += f.count || 0;
      break;
    case 'agent_state':
      updateAgent(f.agent, { state: f.state, current_thread: f.current_thread });
      break;
    case 'message':
      onMessage(f.message);
      break;
    case 'message_status':
      onStatus(f);
      break;
    case 'thread_created':
    case 'thread_updated':
      if (state.thread && (f.thread_id === state.thread || (f.thread && f.thread.id === state.thread))) {
        openThread(state.thread);
      }
      break;
    case 'organism_state':
      setOrganismStatus(f.status);
      break;
    case 'reload':
      organismEvent(f.ok ? `reload ${f.agent || 'organism'}: ok` : `reload ${f.agent || 'organism'} failed: ${f.error || ''}`);
      if (f.ok && !f.agent) {
        allAgents().then((agents) => {
          setAgents(agents);
          // What the reload added or changed stands out for a moment.
          for (const [names, cls] of [[f.added, 'added'], [f.changed, 'changed']]) {
            for (const n of names || []) {
              const node = state.graph && state.graph.getElementById(n);
              if (node && !node.empty()) { node.addClass(cls); setTimeout(() => node.removeClass(cls), 2000); }
            }
          }
        }).catch(() => {});
        refreshOrganism();
      }
      break;
    case 'input_requested':
    case 'input_resolved':
      refreshInbox();
      break;
    case 'usage':
      refreshUsage();
      break;
    case 'deployment':
      organismEvent(`${f.action} ${f.agent} v${f.version ?? ''}${f.ok ? '' : ' refused: ' + (f.error || '')}`);
      break;
    case 'error':
      organismEvent(`error${f.agent ? ' at ' + f.agent : ''}: ${f.error}`);
      break;
    default:
      break;
  }
}

export function organismEvent(text) {
  const ol = $('organism-events');
  ol.prepend(el('li', {}, `${new Date().toLocaleTimeString()} ${text}`));
  while (ol.children.length > 200) ol.lastChild.remove();
}
