//! A large organism for the dashboard to show under load: 200 native listeners in 20 chains
//! of 10 (each forwards to the next, the last keeps), and a paced driver of injects.

use std::time::{Duration, Instant};

use agentserver::{InjectRequest, Organism};

pub const CHAINS: usize = 20;
pub const LENGTH: usize = 10;

/// The organism's listeners (YAML items), on the schema `t.xsd` with its `Ping`.
pub fn listeners() -> String {
    let mut y = String::new();
    for c in 0..CHAINS {
        for i in 0..LENGTH {
            let name = format!("c{c:02}-{i}");
            if i + 1 < LENGTH {
                let next = format!("c{c:02}-{}", i + 1);
                y += &format!("  - {{ name: {name}, description: hop, kind: native, handler: forward, schema: t.xsd, accepts: [Ping], peers: [{next}], config: {{ to: {next} }} }}\n");
            } else {
                y += &format!("  - {{ name: {name}, description: end, kind: native, handler: sink, schema: t.xsd, accepts: [Ping] }}\n");
            }
        }
    }
    y
}

/// Injects into the chains' heads in turn for `length`, `per_s` messages a second in all
/// (each inject makes LENGTH messages); the messages it caused.
pub async fn drive(o: &Organism, per_s: usize, length: Duration) -> usize {
    let threads_per_s = (per_s / LENGTH).max(1);
    let every = Duration::from_secs(1) / threads_per_s as u32;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < length {
        tick.tick().await;
        let head = format!("c{:02}-0", n % CHAINS);
        let r = o.inject(InjectRequest {
            from: "api".into(),
            to: head,
            payload_xml: format!("<Ping><n>{n}</n></Ping>"),
            thread_id: None,
        });
        if r.is_ok() {
            n += 1;
        }
    }
    n * LENGTH
}

/// Starts recording the page's animation frames and long tasks (`window.frames_seen`).
pub const RECORD_FRAMES: &str = "(() => {
  if (window.frames_seen) {
    // Installed already: a new round starts from nothing.
    window.frames_seen = { gaps: [], long_tasks: [], last: performance.now() };
    return;
  }
  window.frames_seen = { gaps: [], long_tasks: [], last: performance.now() };
  const tick = (t) => { const f = window.frames_seen; f.gaps.push(t - f.last); f.last = t; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
  new PerformanceObserver((l) => { for (const e of l.getEntries()) window.frames_seen.long_tasks.push(e.duration); })
    .observe({ type: 'longtask', buffered: false });
})()";

/// What the recording saw: frames, their gaps' p50, p99 and max in ms, long tasks, the log's
/// rows and the JS heap.
pub const FRAME_REPORT: &str = "(() => {
  const g = window.frames_seen.gaps.slice(1).sort((a, b) => a - b);
  const q = (p) => g.length ? g[Math.min(g.length - 1, Math.floor(g.length * p))] : 0;
  return { frames: g.length, p50_ms: q(0.5), p99_ms: q(0.99), max_ms: g.length ? g[g.length - 1] : 0,
    long_tasks: window.frames_seen.long_tasks.length,
    longest_task_ms: Math.max(0, ...window.frames_seen.long_tasks),
    rows: state.log.length, rows_drawn: document.querySelectorAll('#messages tbody tr[data-id]').length,
    agents: document.querySelectorAll('#agent-list [data-agent]').length,
    heap_mb: performance.memory ? performance.memory.usedJSHeapSize / 1048576 : null,
    flows: state.flows, folded: state.folded, dropped: state.dropped };
})()";
