// The agentserver dashboard: a client of the public API (REST under /api/v1, events on
// /ws) and nothing else. No build step; cytoscape draws the topology.
'use strict';

const API = '/api/v1';
const ROLES = ['viewer', 'operator', 'admin'];
const MAX_ROWS = 500;
const $ = (id) => document.getElementById(id);

const state = {
  token: sessionStorage.getItem('agentserver-token') || '',
  me: null,
  organism: null,
  agents: new Map(),
  inbox: [],
  drawing: false,
  /// Messages to add to the log at the next draw, newest last.
  pendingRows: [],
  /// The log: its messages newest first (at most MAX_ROWS), by id, and the rows drawn now
  /// (only those in view: the list is virtual).
  log: [],
  logById: new Map(),
  rows: new Map(),
  flows: 0,
  flowsThisFrame: 0,
  /// Injector name → the agents it sent to.
  sources: new Map(),
  lastSeq: 0,
  dropped: 0,
  folded: 0,
  frozen: false,
  /// What came while the view was frozen, shown when it resumes (at most MAX_ROWS).
  held: [],
  ws: null,
  retry: 0,
  selected: null,
  thread: null,
  threadPage: 0,
  /// The message opened within the thread shown.
  focus: null,
  graph: null,
  /// The graph has changed since it was last drawn (drawn once per frame).
  graphStale: false,
};

// ---- REST -------------------------------------------------------------------------------

async function api(method, path, body) {
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

function el(tag, attrs, ...children) {
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

function notice(text) {
  const n = $('notice');
  n.textContent = text || '';
  n.hidden = !text;
}

const CLOCK = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
/// `{namespace}Local` as `Local`.
function local(type) {
  return (type || '').replace(/^\{[^}]*\}/, '');
}

function time(ts) {
  return ts ? CLOCK.format(new Date(ts)) : '';
}

// ---- Signing in ---------------------------------------------------------------------------

function signedOut(why) {
  state.token = '';
  sessionStorage.removeItem('agentserver-token');
  reset();
  $('app').hidden = true;
  $('loading').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = why || '';
}

/// Forgets everything a credential was shown: the stream, what it said, the views.
function reset() {
  const ws = state.ws;
  state.ws = null;
  if (ws) ws.close();
  state.lastSeq = 0;
  state.dropped = 0;
  state.folded = 0;
  state.selected = null;
  state.thread = null;
  state.agents = new Map();
  state.sources = new Map();
  if (state.graph) { state.graph.destroy(); state.graph = null; }
  clearLog();
  state.inbox = [];
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

async function start() {
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
function applyRole() {
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

// ---- The organism -------------------------------------------------------------------------

async function refreshOrganism() {
  try {
    state.organism = await api('GET', '/organism');
  } catch (e) {
    return;
  }
  showOrganism();
}

function showOrganism() {
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

function showReload(r, e) {
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

// ---- Agents and the topology --------------------------------------------------------------

/// Injectors (`api`, `ws`, `cli`, `key:NAME`, a token's subject) are source nodes, drawn
/// once they have sent something: `src:` + their name. Until then one node stands for them.
const INJECTORS = '(injectors)';

/// Every agent the credential sees (the API's largest page).
async function allAgents() {
  return (await api('GET', '/agents?limit=1000')).items;
}
const source = (who) => 'src:' + who;

function setAgents(list) {
  state.agents = new Map(list.map((a) => [a.name, a]));
  renderAgents();
  renderGraph();
  fillInjectTargets();
}

function renderAgents() {
  const ul = $('agent-list');
  ul.replaceChildren();
  for (const a of state.agents.values()) {
    ul.append(el('li', {},
      el('button', { type: 'button', class: 'agent state-' + a.state, 'data-agent': a.name,
        onclick: () => selectAgent(a.name) },
        el('span', { class: 'name' }, a.name), ' ',
        el('span', { class: 'kind' }, a.kind), ' ',
        el('span', { class: 'state' }, a.state), ' ',
        el('span', { class: 'queue', title: 'queue depth' }, 'queue ' + a.queue_depth))));
  }
}

function renderGraph() {
  state.graphStale = false;
  if (typeof cytoscape === 'undefined') return;
  const nodes = [];
  const edges = [];
  if (!state.sources.size) nodes.push({ data: { id: INJECTORS, label: 'injectors', kind: 'source' } });
  for (const who of state.sources.keys()) nodes.push({ data: { id: source(who), label: who, kind: 'source' } });
  for (const [who, targets] of state.sources) {
    for (const t of targets) {
      if (state.agents.has(t)) edges.push({ data: { id: source(who) + '→' + t, source: source(who), target: t, injector: 1 } });
    }
  }
  // Until an injector has sent something, one node stands for them, pointing at the
  // entry points: the agents no peer names (all of them if every one is named).
  const named = new Set();
  for (const a of state.agents.values()) for (const p of a.peers || []) if (p !== a.name) named.add(p);
  const entries = [...state.agents.keys()].filter((n) => !named.has(n));
  for (const a of state.agents.values()) {
    nodes.push({ data: { id: a.name, label: a.name + (a.queue_depth ? ` (${a.queue_depth})` : ''),
      kind: a.kind, state: a.state } });
    for (const p of a.peers || []) {
      if (state.agents.has(p)) edges.push({ data: { id: a.name + '→' + p, source: a.name, target: p } });
    }
    if (!state.sources.size && (entries.length === 0 || entries.includes(a.name))) {
      edges.push({ data: { id: INJECTORS + '→' + a.name, source: INJECTORS, target: a.name, injector: 1 } });
    }
  }
  if (!state.graph) {
    state.graph = cytoscape({
      container: $('graph'),
      // Cheaper frames for large organisms: one pixel per pixel, a texture while panning.
      pixelRatio: 1,
      textureOnViewport: true,
      elements: { nodes, edges },
      style: [
        { selector: 'node', style: { label: 'data(label)', 'background-color': '#8aa', 'font-size': 11,
          'min-zoomed-font-size': 7,
          'text-valign': 'bottom', 'text-margin-y': 4, width: 26, height: 26 } },
        { selector: 'node[kind="lua"]', style: { shape: 'round-rectangle' } },
        { selector: 'node[kind="external"]', style: { shape: 'diamond' } },
        { selector: 'node[kind="source"]', style: { shape: 'triangle', 'background-color': '#999',
          'text-valign': 'top', 'text-margin-y': -4 } },
        { selector: 'node[state="processing"]', style: { 'background-color': '#3a7' } },
        { selector: 'node[state="waiting"]', style: { 'background-color': '#db3' } },
        { selector: 'node[state="paused"]', style: { 'background-color': '#77c' } },
        { selector: 'node[state="error"]', style: { 'background-color': '#d33' } },
        { selector: 'node:selected', style: { 'border-width': 3, 'border-color': '#036' } },
        { selector: 'node.added', style: { 'border-width': 4, 'border-color': '#3a7' } },
        { selector: 'node.changed', style: { 'border-width': 4, 'border-color': '#e90' } },
        { selector: 'edge', style: { width: 1.5, 'line-color': '#bbb', 'target-arrow-shape': 'triangle',
          'target-arrow-color': '#bbb', 'curve-style': 'bezier', 'font-size': 9, 'min-zoomed-font-size': 7 } },
        { selector: 'edge[injector]', style: { 'line-style': 'dashed' } },
        // An edge that would pass behind a node is bent around it (routeEdges).
        { selector: 'edge[bend]', style: { 'curve-style': 'unbundled-bezier',
          'control-point-distances': 'data(bend)', 'control-point-weights': 0.5 } },
        { selector: 'edge.flow', style: { 'line-color': '#3a7', 'target-arrow-color': '#3a7', width: 3,
          label: 'data(flow)', 'text-background-color': '#fff', 'text-background-opacity': 0.9,
          'text-background-padding': 2 } },
        { selector: 'edge.refused', style: { 'line-color': '#d33', 'target-arrow-color': '#d33', width: 3 } },
      ],
      layout: layout(false),
      maxZoom: 1.4,
    });
    state.graph.on('tap', 'node', (ev) => {
      const id = ev.target.id();
      if (state.agents.has(id)) selectAgent(id);
    });
    state.graph.on('layoutstop dragfree', routeEdges);
    routeEdges();
    return;
  }
  // A change of topology (a reload): keep what stayed, add and remove, lay out again.
  const g = state.graph;
  const want = new Set([...nodes, ...edges].map((e) => e.data.id));
  const standInGone = !g.getElementById(INJECTORS).empty() && !want.has(INJECTORS);
  g.elements().filter((e) => !want.has(e.id())).forEach((e) => {
    // The stand-in leaves at once: the injector that replaces it takes its place.
    if (e.id() === INJECTORS || e.data('source') === INJECTORS) return;
    e.data('leaving', 1);
    e.animate({ style: { opacity: 0 } }, { duration: 400, complete: () => e.remove() });
  });
  let addedAgents = false;
  const newSources = [];
  g.batch(() => {
    for (const e of [...nodes, ...edges]) {
      const have = g.getElementById(e.data.id);
      if (!have.empty()) { have.data(e.data); continue; }
      const added = g.add(e);
      if (e.data.kind === 'source') newSources.push(added);
      else if (!e.data.source) addedAgents = true;
    }
  });
  // The first injector takes the stand-in's place (which pointed at the entry points, as
  // injectors do): no new layout, which for a large graph is the dearest thing there is.
  const standIn = g.getElementById(INJECTORS);
  if (standInGone) {
    if (newSources.length) newSources.shift().position(standIn.position());
    standIn.remove();
  }
  if (addedAgents) {
    // Laid out again without what is fading away (animated while the graph is small).
    const live = g.elements('[^leaving]');
    live.layout(layout(live.nodes().length <= 60)).run();
  } else {
    // Only new injectors: each placed above what it sent to; the rest does not move.
    for (const n of newSources) placeSource(n);
    routeEdges();
  }
}

/// A new injector goes above what it sent to, beside (never on) a node already there:
/// `api` and `ws` sending to the same agent stand side by side.
function placeSource(n) {
  const targets = n.outgoers('node');
  if (targets.empty()) return;
  const box = targets.boundingBox();
  const others = state.graph.nodes().filter((o) => !o.same(n));
  // On the injectors' row when there is one, else just above its targets.
  const row = others.filter('[kind="source"]').map((o) => o.position('y'));
  const y = row.length ? Math.min(...row) : box.y1 - 60;
  const taken = (x) => others.some((o) => Math.abs(o.position('x') - x) < 70 && Math.abs(o.position('y') - y) < 40);
  let x = (box.x1 + box.x2) / 2;
  // Right, left, further right, … of where it would stand.
  for (let i = 1; taken(x) && i <= MAX_SOURCES; i += 1) x += (i % 2 ? 1 : -1) * i * 80;
  n.position({ x, y });
}

/// Clearance, in px, between a bent edge and the centre of a node it passes.
const EDGE_CLEARANCE = 30;
/// Past this many nodes edges are not rerouted (the check is edges × nodes).
const MAX_ROUTED_NODES = 200;

/// An edge whose straight line would pass behind a node it does not join is bent around it,
/// to the side away from the node, so the edge stays visible (api → shouter past greeter).
function routeEdges() {
  const g = state.graph;
  if (!g) return;
  const nodes = g.nodes('[^leaving]');
  if (nodes.length > MAX_ROUTED_NODES) return;
  g.batch(() => g.edges().forEach((e) => {
    const a = e.source().position();
    const b = e.target().position();
    const dx = b.x - a.x;
    const dy = b.y - a.y;
    const len = Math.hypot(dx, dy);
    let bend = 0;
    if (len > 0) {
      nodes.forEach((n) => {
        if (n.same(e.source()) || n.same(e.target())) return;
        const p = n.position();
        const t = ((p.x - a.x) * dx + (p.y - a.y) * dy) / (len * len);
        if (t <= 0.05 || t >= 0.95) return;
        const side = (dx * (p.y - a.y) - dy * (p.x - a.x)) / len;
        if (Math.abs(side) >= EDGE_CLEARANCE) return;
        // A one-point bezier is 2t(1-t)·d from the line at t: enough to clear the node.
        const need = (EDGE_CLEARANCE - Math.abs(side)) / (2 * t * (1 - t));
        const d = Math.min(need, 4 * EDGE_CLEARANCE) * (side > 0 ? -1 : 1);
        if (Math.abs(d) > Math.abs(bend)) bend = d;
      });
    }
    if (bend) e.data('bend', Math.round(bend));
    else e.removeData('bend');
  }));
}

function layout(animate) {
  const roots = state.graph ? state.graph.nodes('[kind="source"][^leaving]').map((n) => n.id()) : [];
  // A fixed box: by default a layout fills the current view, which a zoomed-out graph has
  // made larger, so each layout would spread wider than the last.
  const box = $('graph');
  return { name: 'breadthfirst', roots: roots.length ? roots : undefined, directed: true,
    spacingFactor: 1, padding: 30, fit: true, animate, animationDuration: 400,
    boundingBox: { x1: 0, y1: 0, w: box.clientWidth || 600, h: box.clientHeight || 400 } };
}

/// An injector gets its own node, and its edge, the first time it is seen sending.
/// Injectors drawn one by one, at most; the rest share the node `others`.
const MAX_SOURCES = 40;

function noteSource(from, to) {
  if (state.agents.has(from) || !state.agents.has(to)) return;
  if (!state.sources.has(from) && state.sources.size >= MAX_SOURCES) from = 'others';
  const targets = state.sources.get(from) || new Set();
  if (targets.has(to)) return;
  targets.add(to);
  state.sources.set(from, targets);
  // Drawn with the frame: many new sources at once are one layout.
  state.graphStale = true;
}

/// At most this many edges light up in one frame; the rest are counted, not drawn.
const FLOWS_PER_FRAME = 30;

function flow(from, to, label, refused) {
  if (!state.graph) return;
  noteSource(from, to);
  state.flows += 1;
  // A large organism lights fewer a frame: each one redraws the canvas.
  const limit = state.agents.size > 50 ? FLOWS_PER_FRAME / 3 : FLOWS_PER_FRAME;
  if (state.flowsThisFrame >= limit) return;
  state.flowsThisFrame += 1;
  const who = state.agents.has(from) || state.sources.has(from) ? from : 'others';
  const id = (state.agents.has(who) ? who : source(who)) + '→' + to;
  let e = state.graph.getElementById(id);
  if (e.empty() && state.agents.has(from) && state.agents.has(to)) {
    e = state.graph.add({ data: { id, source: from, target: to } });
  }
  if (e.empty()) return;
  // A large organism's lit edges carry no label: text is the dearest thing to draw.
  e.data('flow', state.agents.size > 50 ? '' : label || '');
  e.addClass(refused ? 'refused' : 'flow');
  setTimeout(() => e.removeClass('flow refused'), 600);
}

function updateAgent(name, fields) {
  const a = state.agents.get(name);
  if (!a) return;
  const before = [a.state, a.queue_depth];
  Object.assign(a, fields);
  if (before[0] === a.state && before[1] === a.queue_depth) {
    if (state.selected === name) showAgentFacts(a);
    return;
  }
  const b = document.querySelector(`#agent-list [data-agent="${CSS.escape(name)}"]`);
  if (b) {
    b.className = 'agent state-' + a.state;
    b.querySelector('.state').textContent = a.state;
    b.querySelector('.queue').textContent = 'queue ' + a.queue_depth;
  }
  if (state.graph) {
    const n = state.graph.getElementById(name);
    n.data('state', a.state);
    n.data('label', a.name + (a.queue_depth ? ` (${a.queue_depth})` : ''));
  }
  if (state.selected === name) showAgentFacts(a);
}

/// Calls of one kind numbered in turn: the function `begin(kind)` returns says whether no
/// later call of that kind has begun, so an answer that arrives late (the agent chosen before,
/// the inject target chosen before) does not overwrite or add to a newer one's.
const begun = new Map();
function begin(kind) {
  const n = (begun.get(kind) || 0) + 1;
  begun.set(kind, n);
  return () => begun.get(kind) === n;
}

// ---- Addresses: #/agents/NAME and #/threads/ID can be shared and reloaded ----------------

function setHash(hash) {
  if (location.hash !== hash) history.replaceState(null, '', hash);
}

function followHash() {
  const [, kind, id] = location.hash.match(/^#\/(agents|threads)\/(.+)$/) || [];
  if (!id) return;
  const name = decodeURIComponent(id);
  if (kind === 'agents') selectAgent(name);
  else openThread(name);
}
window.addEventListener('hashchange', followHash);

async function selectAgent(name) {
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
    state.agents.set(name, a);
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
function roundMs(v) {
  if (typeof v !== 'number') return v;
  if (v === 0) return '0';
  if (v < 1) return v.toPrecision(2);
  return v < 100 ? v.toFixed(1) : v.toFixed(0);
}

function showAgentFacts(a) {
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

async function schemaOf(name) {
  const headers = state.token ? { Authorization: 'Bearer ' + state.token } : {};
  const r = await fetch(`${API}/agents/${encodeURIComponent(name)}/schema`, { headers });
  if (!r.ok) throw new Error('schema: ' + r.status);
  return r.text();
}

// ---- The event stream -----------------------------------------------------------------------

function connect() {
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

function setConnection(s) {
  $('connection-state').textContent = s;
  $('connection').className = 'conn-' + s;
}

/// Frames wait for the next animation frame and are drawn together: however fast they
/// come, the page changes once a frame. The inbox is bounded: past INBOX frames (a hidden
/// tab draws nothing), the oldest messages are dropped and counted, never the rest.
const INBOX = 5000;
function receive(f) {
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

function draw() {
  if (!state.drawing) return;
  state.drawing = false;
  const frames = state.inbox;
  state.inbox = [];
  state.flowsThisFrame = 0;
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

function onFrame(f) {
  switch (f.event) {
    case 'connected':
      state.retry = 0;
      setConnection('live');
      if (f.organism) { state.organism = f.organism; showOrganism(); }
      if (f.agents) setAgents(f.agents);
      else allAgents().then(setAgents).catch(() => {});
      if (f.threads && !$('view-threads').hidden) loadThreads();
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
      if (state.organism) { state.organism.status = f.status; showOrganism(); }
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

function organismEvent(text) {
  const ol = $('organism-events');
  ol.prepend(el('li', {}, `${new Date().toLocaleTimeString()} ${text}`));
  while (ol.children.length > 200) ol.lastChild.remove();
}

// ---- The message log ------------------------------------------------------------------------

function globToRegExp(g) {
  return new RegExp('^' + g.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.') + '$');
}

function messageFilter() {
  const f = new FormData($('message-filters'));
  const agents = String(f.get('agents') || '').split(',').map((s) => s.trim()).filter(Boolean).map(globToRegExp);
  return {
    agents,
    thread: String(f.get('thread') || '').trim(),
    type: String(f.get('type') || '').trim(),
    status: String(f.get('status') || ''),
  };
}

function matches(m, f) {
  if (f.agents.length && !f.agents.some((r) => r.test(m.from) || (m.to && r.test(m.to)))) return false;
  if (f.thread && m.thread_id !== f.thread) return false;
  if (f.type && !(m.payload_type === f.type || (m.payload_type || '').endsWith('}' + f.type))) return false;
  if (f.status && m.status !== f.status) return false;
  return true;
}

function messageRow(m) {
  const type = local(m.payload_type);
  return el('tr', { 'data-id': m.id, class: 'status-' + m.status },
    el('td', {}, time(m.timestamp)),
    el('td', {}, m.from), el('td', {}, m.to || ''), el('td', {}, type),
    el('td', { class: 'status' }, m.status),
    el('td', {}, el('button', { type: 'button', class: 'link', title: m.thread_id, onclick: () => openThread(m.thread_id, m.id) }, m.thread_id)));
}

function onMessage(m) {
  const refused = ['rejected', 'undeliverable', 'failed'].includes(m.status);
  if (m.to) flow(m.from, m.to, local(m.payload_type), refused);
  if (state.thread === m.thread_id) openThread(m.thread_id);
  if (!matches(m, messageFilter())) return;
  if (state.frozen) {
    state.held.push(m);
    if (state.held.length > MAX_ROWS) state.held.shift();
    $('frozen-count').textContent = `${state.held.length} new while frozen`;
    return;
  }
  if (state.logById.has(m.id)) return;
  state.pendingRows.push(m);
  if (state.pendingRows.length > MAX_ROWS) state.pendingRows.shift();
}

/// Height of one row of the log (app.css), which the virtual list counts in.
const ROW_PX = 28;

function clearLog() {
  state.log = [];
  state.logById.clear();
  state.rows.clear();
  state.pendingRows = [];
  $('messages').tBodies[0].replaceChildren();
}

/// Adds the messages that came since the last draw at once, newest first, keeps MAX_ROWS,
/// and draws the rows in view. A reader scrolled down keeps their place.
function flushRows() {
  if (!state.pendingRows.length) return;
  const fresh = [];
  for (const m of state.pendingRows.reverse()) {
    if (state.logById.has(m.id)) continue;
    state.logById.set(m.id, m);
    fresh.push(m);
  }
  state.pendingRows = [];
  state.log = fresh.concat(state.log);
  for (const m of state.log.splice(MAX_ROWS)) state.logById.delete(m.id);
  const box = $('log');
  if (box.scrollTop > 0) box.scrollTop += fresh.length * ROW_PX;
  renderLog();
}

/// Older messages go below what is shown.
function appendLog(messages) {
  for (const m of messages) {
    if (state.logById.has(m.id) || state.log.length >= MAX_ROWS) continue;
    state.logById.set(m.id, m);
    state.log.push(m);
  }
  renderLog();
}

/// Draws the rows in view (and a few either side) between two spacers as tall as the rows
/// they stand for.
function renderLog() {
  const box = $('log');
  const first = Math.max(0, Math.floor(box.scrollTop / ROW_PX) - 5);
  const last = Math.min(state.log.length, first + Math.ceil(box.clientHeight / ROW_PX) + 10);
  const spacer = (n) => {
    const tr = el('tr', { class: 'spacer', 'aria-hidden': 'true' });
    tr.style.height = n * ROW_PX + 'px';
    return tr;
  };
  const rows = document.createDocumentFragment();
  state.rows.clear();
  if (first > 0) rows.append(spacer(first));
  for (let i = first; i < last; i++) {
    const row = messageRow(state.log[i]);
    state.rows.set(state.log[i].id, row);
    rows.append(row);
  }
  if (last < state.log.length) rows.append(spacer(state.log.length - last));
  $('messages').tBodies[0].replaceChildren(rows);
}

let logScroll = false;
$('log').addEventListener('scroll', () => {
  if (logScroll) return;
  logScroll = true;
  requestAnimationFrame(() => { logScroll = false; renderLog(); });
});

function onStatus(f) {
  if (['rejected', 'undeliverable', 'failed'].includes(f.status) && f.to) flow(f.from, f.to, '', true);
  const row = state.rows.get(f.id);
  const logged = state.logById.get(f.id) || state.pendingRows.find((m) => m.id === f.id);
  if (logged) logged.status = f.status;
  if (row) {
    row.className = 'status-' + f.status;
    row.querySelector('.status').textContent = f.status;
  }
  for (const m of state.held) if (m.id === f.id) m.status = f.status;
  if (state.thread === f.thread_id) openThread(f.thread_id);
}

$('freeze').addEventListener('click', () => {
  state.frozen = !state.frozen;
  $('freeze').textContent = state.frozen ? 'Resume' : 'Freeze';
  if (!state.frozen) {
    const held = state.held;
    state.held = [];
    $('frozen-count').textContent = '';
    for (const m of held) onMessage(m);
    flushRows();
  }
});

$('message-filters').addEventListener('change', () => {
  clearLog();
  loadOlder();
});
$('message-filters').addEventListener('submit', (ev) => ev.preventDefault());

async function loadOlder() {
  const f = new FormData($('message-filters'));
  const q = new URLSearchParams();
  const agents = String(f.get('agents') || '').trim();
  if (agents && !/[*?,]/.test(agents)) q.set('agent', agents);
  for (const [k, name] of [['thread', 'thread'], ['type', 'payload_type'], ['status', 'status']]) {
    const v = String(f.get(k) || '').trim();
    if (v) q.set(name, v);
  }
  try {
    q.set('limit', '1');
    const head = await api('GET', '/messages?' + q);
    const total = head.total;
    const shown = state.log.length;
    // The newest `limit` before those shown; a page the server cut by bytes serves fewer,
    // the oldest of the window, so ask again for the newest that many.
    let limit = Math.min(100, Math.max(0, total - shown));
    let page;
    for (;;) {
      q.set('limit', String(limit));
      q.set('offset', String(Math.max(0, total - shown - limit)));
      page = await api('GET', '/messages?' + q);
      if (page.items.length >= limit || page.items.length === 0) break;
      limit = page.items.length;
    }
    const filter = messageFilter();
    const older = page.items.slice().reverse();
    for (const m of older) if (m.to) noteSource(m.from, m.to);
    appendLog(older.filter((m) => matches(m, filter)));
    if (state.graphStale) renderGraph();
  } catch (e) {
    notice('Older messages: ' + e.message);
  }
}
$('older').addEventListener('click', loadOlder);

// ---- Threads --------------------------------------------------------------------------------

const PAGE = 25;

async function loadThreads() {
  const f = new FormData($('thread-filters'));
  const id = String(f.get('id') || '').trim();
  if (id) { openThread(id); return; }
  const q = new URLSearchParams({ limit: String(PAGE), offset: String(state.threadPage * PAGE) });
  const status = String(f.get('status') || '');
  const agent = String(f.get('agent') || '').trim();
  if (status) q.set('status', status);
  if (agent) q.set('agent', agent);
  try {
    const page = await api('GET', '/threads?' + q);
    $('thread-list').replaceChildren(...page.items.map((t) => el('li', {},
      el('button', { type: 'button', class: 'link thread-' + t.status, 'data-thread': t.id,
        onclick: () => openThread(t.id) }, t.id),
      ` ${t.status} · ${t.message_count} messages · ${(t.participants || []).join(', ')}`)));
    const last = Math.max(0, Math.ceil(page.total / PAGE) - 1);
    $('threads-page').textContent = `page ${state.threadPage + 1} of ${last + 1} (${page.total} threads)`;
  } catch (e) {
    notice('Threads: ' + e.message);
  }
}

$('thread-filters').addEventListener('submit', (ev) => { ev.preventDefault(); state.threadPage = 0; loadThreads(); });
$('threads-prev').addEventListener('click', () => { state.threadPage = Math.max(0, state.threadPage - 1); loadThreads(); });
$('threads-next').addEventListener('click', () => { state.threadPage += 1; loadThreads(); });

let threadTimer = null;
function openThread(id, message) {
  // A thread newly opened is the address; one redrawn as it grows leaves it as it is.
  if (id !== state.thread) setHash('#/threads/' + encodeURIComponent(id));
  // Many events for one thread come at once: draw it once for them.
  if (id !== state.thread) state.focus = null;
  if (message) state.focus = message;
  state.thread = id;
  if (threadTimer) return;
  threadTimer = setTimeout(() => { threadTimer = null; drawThread(state.thread); }, 100);
}

async function drawThread(id) {
  selectTab('threads');
  let t;
  try {
    t = await api('GET', '/threads/' + encodeURIComponent(id));
  } catch (e) {
    $('thread').hidden = false;
    $('thread-title').textContent = 'Thread ' + id;
    $('thread-facts').textContent = e.message;
    $('thread-tree').replaceChildren();
    $('thread-timeline').replaceChildren();
    return;
  }
  $('thread').hidden = false;
  $('thread-title').textContent = 'Thread ' + t.id;
  $('thread-facts').textContent = `${t.status} · ${t.message_count} messages${t.error ? ' · ' + t.error : ''}`;
  $('thread-kill').disabled = t.status !== 'active';
  const msgs = t.messages || [];
  const children = new Map();
  for (const m of msgs) {
    const p = m.parent_id || '';
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(m);
  }
  const ids = new Set(msgs.map((m) => m.id));
  const branch = (m) => el('li', {}, messageText(m),
    children.has(m.id) ? el('ul', {}, children.get(m.id).map(branch)) : null);
  const roots = msgs.filter((m) => !m.parent_id || !ids.has(m.parent_id));
  $('thread-tree').replaceChildren(...roots.map(branch));
  $('thread-timeline').replaceChildren(...msgs.map((m) => el('li', {}, `${time(m.timestamp)} `, messageText(m))));
}

function messageText(m) {
  const type = local(m.payload_type);
  return el('details', { class: 'status-' + m.status, 'data-message': m.id, open: state.focus === m.id },
    el('summary', {}, `${m.from} → ${m.to || '—'} ${type} [${m.status}]${m.error ? ' ' + m.error : ''}`),
    el('pre', { 'aria-label': 'payload as JSON' }, JSON.stringify(m.payload, null, 2)),
    el('pre', { 'aria-label': 'payload as XML' }, m.payload_xml || ''));
}

$('thread-kill').addEventListener('click', async () => {
  if (!state.thread || !confirm('Kill this thread?')) return;
  try { await api('POST', `/threads/${encodeURIComponent(state.thread)}/kill`); openThread(state.thread); }
  catch (e) { notice('Kill refused: ' + e.message); }
});

// ---- Inject ---------------------------------------------------------------------------------

function fillInjectTargets() {
  const sel = $('inject-to');
  const keep = sel.value;
  sel.replaceChildren(...[...state.agents.values()].map((a) => el('option', { value: a.name }, a.name)));
  if (state.agents.has(keep)) sel.value = keep;
  injectTypes();
}

/// The elements of `type` (one `name` accepts) as a tree, in schema order, as the server
/// reads its schema (`GET /agents/{name}/fields`): each with its name, its XSD type, its
/// JSON kind, whether it is optional or repeated, and its own elements when it has some.
async function fieldsOf(name, type) {
  const r = await api('GET', `/agents/${encodeURIComponent(name)}/fields?type=${encodeURIComponent(type)}`);
  return r.fields;
}

/// One form control per leaf element (its path in `data-path`), a fieldset per element
/// with elements of its own.
function fieldControls(fields, prefix) {
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

async function injectTypes() {
  const name = $('inject-to').value;
  const a = state.agents.get(name);
  const types = (a && a.accepts) || [];
  const sel = $('inject-type');
  sel.replaceChildren(...types.map((t) => el('option', { value: t }, local(t))));
  await injectFields();
}

async function injectFields() {
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

// ---- Tabs -----------------------------------------------------------------------------------

function selectTab(name) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t.id === 'tab-' + name;
    t.setAttribute('aria-selected', on ? 'true' : 'false');
    $(t.getAttribute('aria-controls')).hidden = !on;
  }
  if (name === 'threads' && !$('thread-list').children.length) loadThreads();
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
start();
