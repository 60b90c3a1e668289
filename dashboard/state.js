// The dashboard's state, in one place: what it knows of the organism, its stream and its
// views. Any module reads it; each field is changed only by the module named beside it,
// through that module's functions, and `forgetAll` (signing out) clears what a credential
// was shown.

export const API = '/api/v1';
export const ROLES = ['viewer', 'operator', 'admin'];
export const MAX_ROWS = 500;
export const $ = (id) => document.getElementById(id);

export const state = {
  /// signin.js: the credential, and who it is (`GET /me`).
  token: sessionStorage.getItem('agentserver-token') || '',
  me: null,
  /// organism.js: the organism, from its answer or a stream's snapshot.
  organism: null,
  /// graph.js: every agent by name.
  agents: new Map(),
  /// stream.js: frames waiting for the next draw, and whether one is due.
  inbox: [],
  drawing: false,
  /// log.js: messages to add to the log at the next draw, newest last.
  pendingRows: [],
  /// log.js: the log: its messages newest first (at most MAX_ROWS), by id, and the rows
  /// drawn now (only those in view: the list is virtual).
  log: [],
  logById: new Map(),
  rows: new Map(),
  /// graph.js: edges lit, in all and in this frame.
  flows: 0,
  flowsThisFrame: 0,
  /// graph.js: injector name → the agents it sent to.
  sources: new Map(),
  /// stream.js: the last `seq` seen, what was dropped and folded, the socket, its retries.
  lastSeq: 0,
  dropped: 0,
  folded: 0,
  ws: null,
  retry: 0,
  /// log.js: frozen, and what came meanwhile, shown when it resumes (at most MAX_ROWS).
  frozen: false,
  held: [],
  /// address.js: the agent whose panel is open.
  selected: null,
  /// threads.js: the thread shown, the page of the list, the message opened in it.
  thread: null,
  threadPage: 0,
  focus: null,
  /// batch.js: the label tests of the threads' search (`key:value`), as chips.
  labelFilters: [],
  /// graph.js: the drawing, and whether it changed since it was last drawn (once a frame).
  graph: null,
  graphStale: false,
};

/// Forgets what a credential was shown (signing out, or another credential): the stream's
/// place and counters, the agents, the injectors, the drawing, the open agent and thread.
/// The socket is closed by its owner first.
export function forgetAll() {
  state.ws = null;
  state.lastSeq = 0;
  state.dropped = 0;
  state.folded = 0;
  state.selected = null;
  state.thread = null;
  state.agents = new Map();
  state.sources = new Map();
  if (state.graph) { state.graph.destroy(); state.graph = null; }
  state.inbox = [];
  state.labelFilters = [];
}
