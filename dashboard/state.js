// The dashboard's state, owned here: what it knows of the organism, its stream and its
// views. Other modules read it and change it through their named functions.

export const API = '/api/v1';
export const ROLES = ['viewer', 'operator', 'admin'];
export const MAX_ROWS = 500;
export const $ = (id) => document.getElementById(id);

export const state = {
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
