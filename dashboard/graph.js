// The dashboard: agents and the topology.

import { selectAgent, showAgentFacts } from './address.js';
import { api, el } from './api.js';
import { fillInjectTargets } from './inject.js';
import { $, state } from './state.js';

/// Injectors (`api`, `ws`, `cli`, `key:NAME`, a token's subject) are source nodes, drawn
/// once they have sent something: `src:` + their name. Until then one node stands for them.
export const INJECTORS = '(injectors)';

/// Every agent the credential sees (the API's largest page).
export async function allAgents() {
  return (await api('GET', '/agents?limit=1000')).items;
}
export const source = (who) => 'src:' + who;

export function setAgents(list) {
  state.agents = new Map(list.map((a) => [a.name, a]));
  renderAgents();
  renderGraph();
  fillInjectTargets();
}

export function renderAgents() {
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

export function renderGraph() {
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
export function placeSource(n) {
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
export const EDGE_CLEARANCE = 30;
/// Past this many nodes edges are not rerouted (the check is edges × nodes).
export const MAX_ROUTED_NODES = 200;

/// An edge whose straight line would pass behind a node it does not join is bent around it,
/// to the side away from the node, so the edge stays visible (api → shouter past greeter).
export function routeEdges() {
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

export function layout(animate) {
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
export const MAX_SOURCES = 40;

export function noteSource(from, to) {
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
export const FLOWS_PER_FRAME = 30;

export function flow(from, to, label, refused) {
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

/// An agent as its own answer describes it (`GET /agents/{name}`).
export function rememberAgent(name, a) {
  state.agents.set(name, a);
}

/// A new animation frame: no edge lit in it yet.
export function newFrame() {
  state.flowsThisFrame = 0;
}

export function updateAgent(name, fields) {
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
export const begun = new Map();
export function begin(kind) {
  const n = (begun.get(kind) || 0) + 1;
  begun.set(kind, n);
  return () => begun.get(kind) === n;
}
