// The agentserver dashboard: a client of the public API (REST under /api/v1, events on
// /ws) and nothing else. Native ES modules, no build step; cytoscape (a classic script,
// loaded first) draws the topology. Each module owns one view; `state.js` owns the state.

import { api } from './api.js';
import { selectAgent } from './address.js';
import { renderGraph } from './graph.js';
import { flushRows } from './log.js';
import { start } from './signin.js';
import { $, state } from './state.js';
import { injectTypes } from './inject.js';
import { loadInbox } from './inbox.js';
import './organism.js';
import './stream.js';
import './tabs.js';
import './threads.js';
import './batch.js';

// For a developer's console and the browser tests: the state and the hooks they drive.
Object.assign(window, { $, state, api, selectAgent, renderGraph, flushRows, injectTypes, loadInbox });

start();
