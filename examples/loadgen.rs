//! Load generator: starts an organism in-process, drives one workload, and prints throughput
//! and latency percentiles (p50, p90, p99, max) as text and as one JSON line. Every run also
//! measures two single-thread ceilings on the same payloads, no pump: our strict read + XSD
//! validation (`ceiling_validations_per_s`, `ratio_to_ceiling`), and libxml2's parse +
//! validation alone (`ceiling_libxml2_per_s`, `ratio_to_libxml2_ceiling`), so each figure is
//! also a ratio to what validation alone costs (`LOADGEN_NO_CEILING=1` skips them, for a
//! profile of the pump alone). `LOADGEN_OWN_SCHEMAS=1` gives each listener a schema of its
//! own text, so that a payload a listener hands on unchanged is read again at every hop (by
//! default the chain's three listeners share one XSD text, and a forwarded payload keeps the
//! verdict it earned at the first). `LOADGEN_CLIENT_QUEUE=N` and
//! `LOADGEN_CLIENT_QUEUE_BYTES=N` set the API's `client_queue` and `client_queue_bytes`
//! (frames and bytes queued per WebSocket client) for `ws50`; its output names where the
//! least-served reader lost frames (`least_served_gaps`). `LOADGEN_STALL_MS=N` holds one
//! runtime worker up for N ms every 3 s of the measured run (a vCPU the host takes away);
//! `LOADGEN_EVENT_CAPACITY=N` sets the event hub's ring (`OrganismBuilder::event_capacity`).
//!
//! Run: `cargo run --release --example loadgen -- WORKLOAD [THREADS] [--pace N]`, or against
//! a running server: `… -- remote [THREADS] --url http://HOST:PORT [--to NAME] [--payload XML]
//! [--concurrency N]`; `--bytes N` pads each generated payload to about N bytes. `--pace N` injects N threads/s (open loop) instead of as fast as 256
//! in flight allow. `--workers N` sets the runtime's worker threads (default 2, this
//! machine's cores). The driver (the injectors, the closed loop's waits, `rest`'s measured
//! client) runs as tasks on those workers, as an embedder's or the API's own tasks do;
//! `--driver-thread` runs it on the main thread instead (`block_on`), a busy OS thread
//! beside the workers, as every figure before 2026-11-22's seventh session was measured.
//! Workloads:
//!
//! - `chain`: a → b → c, native `forward` handlers, every hop's payload validated for its
//!   receiver (libxml2 reads it at the first; the same XSD text keeps that verdict after),
//!   SQLite store on.
//! - `chain-memory`: the same with `store: memory` (the store's cost is the difference).
//! - `lua`: the same chain with Lua handlers.
//! - `fanout`: one payload broadcast to 8 listeners (copies counted as deliveries).
//! - `ws50`: `chain` while 50 `/ws/messages` clients read every message; each checks that
//!   its frames come in `seq` order and that every message it missed lies in an announced
//!   `dropped` gap, and the fraction each received is reported.
//! - `rest`: REST inject closed-loop latency (POST `/api/v1/inject` → 202 → thread
//!   completed) through the HTTP stack, one request at a time, while the `chain` organism
//!   carries half of its measured peak from in-process injectors.
//! - `rest-memory`: the same with `store: memory` (what the store adds to the tail).
//! - `rest-auth`: `rest` with `auth: {methods: [keys]}`, each request presenting a key.
//! - `rest-pair`: `rest` and `rest-auth` side by side in one process, requests alternating
//!   between them, each organism at a quarter of peak; their percentiles and ratios.
//!   `rest-pair-control`: the same with both sides `auth: none` (the method's own bias).
//!   `rest-pair-keyed`: both `auth: none`, the second side's injects each with an
//!   `Idempotency-Key` (what keeping a key costs).
//! - `startup`: `organisms/hello-world.yaml` (Lua sandboxes, XSDs, the DSL) from nothing to
//!   serving its API, 10 times; `--store memory` as in a trial, so no file is written.
//! - `rss`: `chain` with retention (`max_messages: 100000`) through 5M messages (`--millions
//!   N` for another count); the resident set size after each million, and its median and
//!   maximum over each million (read every 100 ms).
//! - `remote`: a running server (`agentserver run …`): REST injects closed-loop, each timed
//!   until its thread's final `thread_updated` on `/ws`.
//! - `ws50-auth`: `ws50` with `auth: {methods: [keys]}`, each reader presenting a key.
//! - `tenants`: two tenants' Lua agents on one organism (store on, keys). Tenant beta's
//!   requests are measured one at a time (as `rest`) in rounds that alternate what tenant
//!   acme does meanwhile: nothing, inject at its `inject_per_s` (500), at four times it
//!   (most refused, 429), or send as many `GET /healthz` (the floor: what that many of the
//!   cheapest requests cost this machine); beta's percentiles in each and their ratios to
//!   the quiet rounds.
//! - `all`: chain, chain-memory, lua, fanout, ws50.

use std::time::{Duration, Instant};

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::{InjectRequest, Organism};
use serde_json::json;

/// The allocator the `agentserver` binary uses, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Note"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/><xs:element name="n" type="xs:int"/>
  </xs:sequence></xs:complexType></xs:element>
  <xs:element name="Copy"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;
const FORWARD_LUA: &str = "function handle(p, m) return { to = m.own_name == 'a' and 'b' or 'c', type = 'Note', payload = p } end";
/// Forwards to the listener its config names (`tenants`).
const TO_LUA: &str = "local to\nfunction init(c) to = c.to end\nfunction handle(p, m) return { to = to, type = 'Note', payload = p } end\n";
/// Threads in flight at once (closed loop).
const WINDOW: usize = 256;

/// Padding that `--bytes N` adds to each payload's text, so a payload is about N bytes.
static PAD: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn payload(i: usize) -> String {
    let pad = PAD.get().map_or("", String::as_str);
    format!("<Note><text>load message number {i}{pad}</text><n>{i}</n></Note>")
}

fn organism_yaml(workload: &str) -> String {
    let store = if workload == "chain-memory" {
        "memory"
    } else {
        "data.db"
    };
    let auth = if workload == "ws50-auth" {
        "auth: { methods: [keys] }\n"
    } else {
        ""
    };
    let head = format!("organism: {{ name: loadgen, store: {store} }}\n{auth}listeners:\n");
    let body = match workload {
        "lua" => "  - { name: a, description: a, kind: lua, script: fwd.lua, schema: t.xsd, accepts: [Note], concurrency: 2 }
  - { name: b, description: b, kind: lua, script: fwd.lua, schema: t.xsd, accepts: [Note], concurrency: 2 }
  - { name: c, description: c, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 2 }
"
        .to_string(),
        "fanout" => {
            let mut s = String::from("  - { name: a, description: a, kind: native, handler: template, schema: t.xsd, accepts: [Note], concurrency: 2, config: { output: '<Copy><text>{text}</text></Copy>' } }\n");
            for i in 0..8 {
                s.push_str(&format!("  - {{ name: s{i}, description: s, kind: native, handler: sink, schema: t.xsd, accepts: [Copy], concurrency: 2 }}\n"));
            }
            s
        }
        _ => "  - { name: a, description: a, kind: native, handler: forward, schema: t.xsd, accepts: [Note], concurrency: 2, config: { to: b } }
  - { name: b, description: b, kind: native, handler: forward, schema: t.xsd, accepts: [Note], concurrency: 2, config: { to: c } }
  - { name: c, description: c, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 2 }
"
        .to_string(),
    };
    format!("{head}{body}")
}

/// Starts the organism `yaml` describes in a fresh directory holding the schema and the Lua
/// script it may name. The directory (and a store file in it) lives as long as the guard.
/// With `LOADGEN_OWN_SCHEMAS=1` each listener gets a schema file of its own whose text
/// differs (by a comment), so a payload handed on unchanged is read by libxml2 at every hop
/// instead of keeping the verdict of a schema of the same text.
fn start(yaml: &str) -> Result<(tempfile::TempDir, Organism), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("t.xsd"), XSD)?;
    std::fs::write(dir.path().join("fwd.lua"), FORWARD_LUA)?;
    std::fs::write(dir.path().join("to.lua"), TO_LUA)?;
    let mut yaml = yaml.to_string();
    if std::env::var_os("LOADGEN_OWN_SCHEMAS").is_some() {
        let mut own = String::new();
        for line in yaml.lines() {
            let name = line
                .split_once("name: ")
                .and_then(|(_, rest)| rest.split_once(','))
                .map(|(name, _)| name.trim());
            match name.filter(|_| line.contains("schema: t.xsd")) {
                Some(name) => {
                    let xsd = format!("{XSD}<!-- {name} -->\n");
                    std::fs::write(dir.path().join(format!("{name}.xsd")), xsd)?;
                    own.push_str(&line.replace("schema: t.xsd", &format!("schema: {name}.xsd")));
                }
                None => own.push_str(line),
            }
            own.push('\n');
        }
        yaml = own;
    }
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, &yaml)?;
    let mut builder = Organism::builder();
    if let Some(n) = env_number("LOADGEN_EVENT_CAPACITY") {
        builder = builder.event_capacity(n);
    }
    let organism = builder.load(&path)?;
    Ok((dir, organism))
}

struct Latencies(Vec<Duration>);

impl Latencies {
    fn ms(&mut self, q: f64) -> f64 {
        self.0.sort_unstable();
        let i = ((self.0.len() as f64 * q).ceil() as usize).saturating_sub(1);
        self.0.get(i).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
    }
}

/// Single-thread ceilings, each the best of five passes over the same payloads, no pump (so
/// a scheduler hiccup does not lower them): our strict read (`normalize_payload`) and XSD
/// validation, what every payload entering the pump costs at the least; and libxml2's parse
/// and validation alone (`Schema::check`, the payloads read beforehand), the benchmarks
/// issue's "raw libxml2 parse + validate".
struct Ceilings {
    strict_read_and_validate: f64,
    libxml2: f64,
}

fn ceiling(n: usize) -> Result<Ceilings, Box<dyn std::error::Error>> {
    // `LOADGEN_NO_CEILING=1`: none measured (a profile of the pump alone); the figures `null`.
    if std::env::var_os("LOADGEN_NO_CEILING").is_some() {
        return Ok(Ceilings {
            strict_read_and_validate: f64::NAN,
            libxml2: f64::NAN,
        });
    }
    let schema = agentserver::schema::Schema::compile("loadgen", XSD)?;
    let limits = agentserver::xml::XmlLimits::default();
    let best = |pass: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| {
        let mut best: f64 = 0.0;
        for _ in 0..5 {
            let started = Instant::now();
            pass()?;
            best = best.max(n as f64 / started.elapsed().as_secs_f64());
        }
        Ok::<f64, Box<dyn std::error::Error>>(best)
    };
    let strict_read_and_validate = best(&mut || {
        for i in 0..n {
            let p = agentserver::xml::normalize_payload(&payload(i), &limits)?;
            schema.validate(p)?;
        }
        Ok(())
    })?;
    let read: Vec<agentserver::xml::SharedXml> = (0..n)
        .map(|i| agentserver::xml::normalize_payload(&payload(i), &limits).map(|p| p.xml))
        .collect::<Result<_, _>>()?;
    let libxml2 = best(&mut || {
        for xml in &read {
            schema.check(xml)?;
        }
        Ok(())
    })?;
    Ok(Ceilings {
        strict_read_and_validate,
        libxml2,
    })
}

/// Injects `threads` threads, at most [`WINDOW`] in flight, and waits for each to complete.
/// With `pace` (threads/s) the injections are spread evenly over time instead of as fast as
/// the window allows.
async fn drive(
    organism: &Organism,
    threads: usize,
    hops_per_thread: usize,
    pace: Option<f64>,
) -> Result<(f64, Latencies), Box<dyn std::error::Error>> {
    let mut latencies = Vec::with_capacity(threads);
    let started = Instant::now();
    let mut in_flight = tokio::task::JoinSet::new();
    for i in 0..threads {
        if let Some(pace) = pace {
            let due = started + Duration::from_secs_f64(i as f64 / pace);
            tokio::time::sleep_until(due.into()).await;
        }
        while in_flight.len() >= WINDOW {
            if let Some(r) = in_flight.join_next().await {
                latencies.push(r?);
            }
        }
        let o = organism.clone();
        let sent = Instant::now();
        let receipt = loop {
            match o.inject(InjectRequest {
                from: "api".into(),
                to: "a".into(),
                payload_xml: payload(i),
                thread_id: None,
            }) {
                Ok(r) => break r,
                // Refused for now: wait a moment, as a client told 429 would. Tried again at
                // once, the driver would spin through the store's backlog, and the figure
                // would count that spinning as the organism's CPU.
                Err(agentserver::InjectError::Overloaded { .. })
                | Err(agentserver::InjectError::StoreBehind) => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
                Err(e) => return Err(e.into()),
            }
        };
        in_flight.spawn(async move {
            o.history().wait_thread(&receipt.thread_id).await;
            sent.elapsed()
        });
    }
    while let Some(r) = in_flight.join_next().await {
        latencies.push(r?);
    }
    // The rate is what the organism sustains: with a store, until the writer has committed
    // everything (its queue can hold a backlog the pump has run ahead of).
    if let Some(store) = organism.history().store() {
        let deadline = Instant::now() + Duration::from_secs(60);
        while store.queued() > 0 {
            if Instant::now() > deadline {
                return Err("the store writer did not catch up within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let hops = (threads * hops_per_thread) as f64 / started.elapsed().as_secs_f64();
    Ok((hops, Latencies(latencies)))
}

async fn run(
    workload: &str,
    threads: usize,
    pace: Option<f64>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    // The ceiling first, on a quiet machine (no organism, no store writer yet).
    let ceiling = ceiling(threads)?;
    let (dir, organism) = start(&organism_yaml(workload))?;
    // Deliveries per thread: the hops the figure counts.
    let hops = if workload == "fanout" { 1 + 8 } else { 3 };

    let mut readers = Vec::new();
    let mut server = None;
    if workload.starts_with("ws50") {
        // `ws50-auth`: every reader presents a viewer's key.
        let key = if workload == "ws50-auth" {
            let config = Organism::builder().load_config(&dir.path().join("o.yaml"))?;
            let (key, row) = agentserver::access::new_key(
                "reader",
                agentserver::access::Role::Viewer,
                None,
                None,
            )
            .map_err(|e| e.to_string())?;
            agentserver::access::KeySource::of(&config)?.add(&row)?;
            Some(key)
        } else {
            None
        };
        let mut options = ApiOptions::default();
        if let Some(n) = env_number("LOADGEN_CLIENT_QUEUE") {
            options.client_queue = n;
        }
        if let Some(n) = env_number("LOADGEN_CLIENT_QUEUE_BYTES") {
            options.client_queue_bytes = n;
        }
        let s = ApiServer::bind(organism.clone(), "127.0.0.1:0", options).await?;
        let url = format!("ws://{}/ws/messages", s.local_addr());
        for _ in 0..50 {
            use tokio_tungstenite::tungstenite::client::IntoClientRequest;
            let mut request = url.as_str().into_client_request()?;
            if let Some(k) = &key {
                request
                    .headers_mut()
                    .insert("authorization", format!("Bearer {k}").parse()?);
            }
            let (mut ws, _) = tokio_tungstenite::connect_async(request).await?;
            // The session reads the hub from its `connected` frame on: the load starts
            // after every reader has it (else a reader's first messages were published
            // before it subscribed, and its count comes up short).
            {
                use futures_util::StreamExt;
                match ws.next().await {
                    Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t)))
                        if t.starts_with(r#"{"event":"connected""#) => {}
                    other => return Err(format!("a reader's first frame: {other:?}").into()),
                }
            }
            readers.push(tokio::spawn(async move {
                use futures_util::StreamExt;
                let mut check = OrderCheck::default();
                while let Some(Ok(frame)) = ws.next().await {
                    if let tokio_tungstenite::tungstenite::Message::Text(t) = frame {
                        check.frame(&t);
                    }
                }
                check
            }));
        }
        server = Some(s);
    }

    // Warm up, then measure.
    drive(&organism, threads / 10 + 1, hops, pace).await?;
    let cpu_before = process_cpu_secs();
    let stall_ms: u64 = env_number("LOADGEN_STALL_MS").unwrap_or(0);
    let stalls = stall_a_worker(stall_ms);
    let (rate, mut lat) = drive(&organism, threads, hops, pace).await?;
    if let Some(s) = &stalls {
        s.abort();
    }
    let cpu = process_cpu_secs()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let logged = organism.info().total_messages;
    let writer_cpu = thread_cpu_secs("store-writer");
    organism.stop().await;
    if let Some(s) = server {
        s.shutdown().await;
    }
    // Every reader sees message frames in `seq` order; a message it did not receive must be
    // inside a gap the server announced with a `dropped` frame (observers never slow the pump).
    let mut subscribers = None;
    if !readers.is_empty() {
        let mut checks = Vec::new();
        for r in readers {
            checks.push(r.await?);
        }
        // Exact: received plus announced is what was logged; a reader that fell behind the
        // hub is told how many events it lost, of kinds it cannot know, which bound it.
        let exact = |c: &OrderCheck| {
            let told = c.messages + c.dropped;
            if c.lagged == 0 {
                told == logged
            } else {
                told <= logged && logged <= told + c.lagged
            }
        };
        if let Some(bad) = checks.iter().find(|c| c.out_of_order > 0 || !exact(c)) {
            return Err(format!(
                "a ws reader's count of messages is not exact, or it saw them out of order: \
                 logged {logged}, received {}, announced dropped {}, lagged {}, out of order {}",
                bad.messages, bad.dropped, bad.lagged, bad.out_of_order
            )
            .into());
        }
        let received: Vec<f64> = checks
            .iter()
            .map(|c| c.messages as f64 / logged.max(1) as f64)
            .collect();
        let min = received.iter().cloned().fold(1.0, f64::min);
        let least = checks.iter().min_by_key(|c| c.messages);
        let mean = received.iter().sum::<f64>() / received.len() as f64;
        subscribers = Some(json!({
            "readers": checks.len(),
            "messages_logged": logged,
            "in_order": true,
            "received_fraction_min": (min * 1000.0).round() / 1000.0,
            "received_fraction_mean": (mean * 1000.0).round() / 1000.0,
            "lagged_max": checks.iter().map(|c| c.lagged).max(),
            // Where the least-served reader lost what it did: its gaps, the first's `seq`,
            // and the last `seq` it received.
            "least_served_gaps": least.map(|c| json!({
                "gaps": c.gaps, "first_from_seq": c.first_gap, "last_seq": c.last_seq,
            })),
            "status_frames_per_message": (checks.iter().map(|c| c.statuses).sum::<u64>() as f64
                / checks.iter().map(|c| c.messages).sum::<u64>().max(1) as f64
                * 1000.0)
                .round()
                / 1000.0,
        }));
    }
    Ok(json!({
        "workload": workload,
        "threads": threads,
        "paced_threads_per_s": pace,
        "hops_per_thread": hops,
        "hops_per_s": rate.round(),
        "latency_ms": {"p50": lat.ms(0.5), "p90": lat.ms(0.9), "p99": lat.ms(0.99), "max": lat.ms(1.0)},
        "ceiling_validations_per_s": ceiling.strict_read_and_validate.round(),
        "ratio_to_ceiling": (rate / ceiling.strict_read_and_validate * 1000.0).round() / 1000.0,
        "ceiling_libxml2_per_s": ceiling.libxml2.round(),
        "ratio_to_libxml2_ceiling": (rate / ceiling.libxml2 * 1000.0).round() / 1000.0,
        "subscribers": subscribers,
        "worker_stalls_ms": stalls.is_some().then_some(stall_ms),
        "cpu_us_per_hop": cpu.map(|s| (s * 1e7 / (threads * hops) as f64).round() / 10.0),
        "store_writer_cpu_us_per_message": writer_cpu
            .map(|s| (s * 1e7 / logged.max(1) as f64).round() / 10.0),
    }))
}

/// The number the environment variable `name` holds, if it holds one.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|n| n.parse().ok())
}

/// With `ms` > 0 (`LOADGEN_STALL_MS`), a task that every 3 s of the measured run blocks the
/// worker it runs on for `ms`, as when the host takes one vCPU away: the tasks queued on
/// that worker wait while the other worker (busy with the pump, so it steals nothing) goes on.
fn stall_a_worker(ms: u64) -> Option<tokio::task::JoinHandle<()>> {
    (ms > 0).then(|| {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(3)).await;
                std::thread::sleep(Duration::from_millis(ms));
            }
        })
    })
}

/// CPU seconds (user + system) used so far by this process's threads named `name`, from
/// `/proc/self/task` (Linux; `None` elsewhere or when there is no such thread).
fn thread_cpu_secs(name: &str) -> Option<f64> {
    let mut total = None;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        if let Some(secs) = stat_cpu_secs(&path.join("stat")) {
            *total.get_or_insert(0.0) += secs;
        }
    }
    total
}

/// CPU seconds (user + system, every thread) this process has used so far. On a machine
/// whose cores the run saturates, CPU per hop is what throughput is the inverse of, without
/// the time other tenants of a shared VM take (steal), which wall-clock rates include.
fn process_cpu_secs() -> Option<f64> {
    stat_cpu_secs(std::path::Path::new("/proc/self/stat"))
}

/// User + system CPU seconds from a `/proc/.../stat` file (Linux).
fn stat_cpu_secs(path: &std::path::Path) -> Option<f64> {
    let ticks = 100.0; // USER_HZ, 100 on Linux
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the `(comm)`: state is the first; utime and stime are the 12th and 13th.
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((field(11)? + field(12)?) / ticks)
}

/// The unsigned integer right after `key` in a JSON text (0 when absent).
fn number_after(text: &str, key: &str) -> u64 {
    text.split_once(key)
        .map(|(_, rest)| {
            rest.bytes()
                .take_while(u8::is_ascii_digit)
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))
        })
        .unwrap_or(0)
}

/// What one `/ws/messages` reader saw: message frames, frames whose `seq` did not follow the
/// previous one upward, and the messages `dropped` frames announced. Reads `seq` without parsing the whole frame, so
/// the checking costs the readers little.
#[derive(Default)]
struct OrderCheck {
    messages: u64,
    out_of_order: u64,
    /// Messages `dropped` frames announced as dropped at the reader's queue, and events
    /// they announced as lost behind the hub (of kinds unknown).
    dropped: u64,
    lagged: u64,
    last_seq: u64,
    /// `message_status` frames: status changes a message's frame did not show.
    statuses: u64,
    /// `dropped` frames, and the first one's `from_seq` (where a reader began to lose).
    gaps: u64,
    first_gap: Option<u64>,
}

impl OrderCheck {
    fn frame(&mut self, text: &str) {
        if text.starts_with(r#"{"event":"dropped""#) {
            self.dropped += number_after(text, r#""messages":"#);
            self.lagged += number_after(text, r#""lagged":"#);
            self.gaps += 1;
            if self.first_gap.is_none() {
                self.first_gap = Some(number_after(text, r#""from_seq":"#));
            }
            return;
        }
        // On `/ws/messages` only a status frame (its `/ws` frame) starts with its `seq`.
        if text.starts_with(r#"{"seq""#) {
            self.statuses += 1;
            return;
        }
        if !text.starts_with(r#"{"event":"message""#) {
            return;
        }
        let seq = number_after(text, r#""seq":"#);
        if seq <= self.last_seq {
            self.out_of_order += 1;
        }
        self.last_seq = seq;
        self.messages += 1;
    }
}

/// An organism served over HTTP for the REST workloads, with the key its requests present
/// (with `auth`).
struct RestTarget {
    _dir: tempfile::TempDir,
    organism: Organism,
    server: ApiServer,
    url: String,
    key: Option<String>,
    /// Each request names itself with an `Idempotency-Key` (`rest-pair-keyed`).
    idempotent: bool,
}

impl RestTarget {
    /// `chain` is the organism: `chain` (store on) or `chain-memory`. With `auth`, the
    /// organism has `auth: {methods: [keys]}` and every request presents an operator key.
    async fn start(chain: &str, auth: bool) -> Result<RestTarget, Box<dyn std::error::Error>> {
        let mut yaml = organism_yaml(chain);
        if auth {
            yaml = yaml.replacen("listeners:\n", "auth: { methods: [keys] }\nlisteners:\n", 1);
        }
        let (dir, organism) = start(&yaml)?;
        let key = if auth {
            let config = Organism::builder().load_config(&dir.path().join("o.yaml"))?;
            let (key, row) = agentserver::access::new_key(
                "load",
                agentserver::access::Role::Operator,
                None,
                None,
            )
            .map_err(|e| e.to_string())?;
            agentserver::access::KeySource::of(&config)?.add(&row)?;
            Some(key)
        } else {
            None
        };
        let server =
            ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default()).await?;
        let url = format!("http://{}/api/v1/inject", server.local_addr());
        Ok(RestTarget {
            _dir: dir,
            organism,
            server,
            url,
            key,
            idempotent: false,
        })
    }

    /// Background load: `per_ms` injects every millisecond (coarser bursts would queue the
    /// measured request behind a burst) until `running` is false; (injected, refused).
    fn background(
        &self,
        per_ms: usize,
        running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<(usize, usize)> {
        let o = self.organism.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let (mut n, mut refused) = (0usize, 0usize);
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_ms {
                    let sent = o.inject(InjectRequest {
                        from: "api".into(),
                        to: "a".into(),
                        payload_xml: payload(n),
                        thread_id: None,
                    });
                    refused += usize::from(sent.is_err());
                    n += 1;
                }
            }
            (n, refused)
        })
    }

    /// One measured request: POST inject → 202 → its thread completed.
    async fn one(
        &self,
        http: &reqwest::Client,
        i: usize,
    ) -> Result<Duration, Box<dyn std::error::Error>> {
        Ok(self.timed(http, i).await?.1)
    }

    /// One measured request: (POST → 202 received, POST → its thread completed).
    async fn timed(
        &self,
        http: &reqwest::Client,
        i: usize,
    ) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
        let started = Instant::now();
        let mut request = http.post(&self.url);
        if let Some(k) = &self.key {
            request = request.bearer_auth(k);
        }
        if self.idempotent {
            request = request.header("Idempotency-Key", format!("load-{i}"));
        }
        let r = request
            .json(&json!({"to": "a", "payload_xml": payload(i)}))
            .send()
            .await?;
        if r.status().as_u16() != 202 {
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            return Err(format!("inject answered {status} under load: {body}").into());
        }
        let receipt: serde_json::Value = r.json().await?;
        let accepted = started.elapsed();
        let thread = receipt["thread_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.organism.history().wait_thread(&thread).await;
        Ok((accepted, started.elapsed()))
    }

    async fn stop(self) {
        self.organism.stop().await;
        self.server.shutdown().await;
    }
}

/// Workload (d): REST latency at half of peak load.
/// `chain` is the organism: `chain` (store on) or `chain-memory`.
/// With `auth`, the organism has `auth: {methods: [keys]}` and every measured request
/// presents an operator key (`rest-auth`).
async fn rest(
    threads: usize,
    chain: &str,
    auth: bool,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let target = RestTarget::start(chain, auth).await?;
    // Peak, closed loop; then half of it as background load.
    // (`drive` counts the store writer's drain in the peak: a rate it cannot keep up with is
    // no peak, and half of it would not be half the load.)
    let (peak_hops, _) = drive(&target.organism, threads / 2 + 1, 3, None).await?;
    let per_tick = ((peak_hops / 3.0 / 2.0) / 1000.0).max(1.0) as usize;
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let background = target.background(per_tick, running.clone());

    let http = agentserver::outbound::http_client()?.build()?;
    let samples = (threads / 10).max(100);
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        latencies.push(target.one(&http, i).await?);
    }
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let (injected, refused) = background.await?;
    target.stop().await;
    let mut lat = Latencies(latencies);
    Ok(json!({
        "workload": match (chain, auth) {
            (_, true) => "rest-auth",
            ("chain", _) => "rest",
            _ => "rest-memory",
        },
        "peak_hops_per_s": peak_hops.round(),
        "background_threads_per_s": per_tick * 1000,
        "background_injected": injected,
        "background_refused": refused,
        "samples": samples,
        "latency_ms": {"p50": lat.ms(0.5), "p90": lat.ms(0.9), "p99": lat.ms(0.99), "max": lat.ms(1.0)},
    }))
}

/// Workload `rest-pair`: `rest` (`auth: none`) and `rest-auth` (keys) side by side in one
/// process, measured request by request in alternation (none, keys, keys, none, …), each
/// organism carrying a quarter of the first one's peak as background load, so both see the
/// same moment of this machine. Reports each side's percentiles and their ratio.
/// With `control`, both sides are `auth: none` (`rest-pair-control`): how far apart the
/// method puts two identical servers. With `keyed`, both are `auth: none` and the second
/// side's requests each carry an `Idempotency-Key` (`rest-pair-keyed`).
async fn rest_pair(
    threads: usize,
    control: bool,
    keyed: bool,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let none = RestTarget::start("chain", false).await?;
    let mut keys = RestTarget::start("chain", !control && !keyed).await?;
    keys.idempotent = keyed;
    // Both sides run the same peak pass (so their stores and thread tables hold as much);
    // the background load is a quarter of the slower one's peak.
    let (peak_none, _) = drive(&none.organism, threads / 2 + 1, 3, None).await?;
    let (peak_keys, _) = drive(&keys.organism, threads / 2 + 1, 3, None).await?;
    let peak_hops = peak_none.min(peak_keys);
    let per_tick = ((peak_hops / 3.0 / 4.0) / 1000.0).max(1.0) as usize;
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let backgrounds = [
        none.background(per_tick, running.clone()),
        keys.background(per_tick, running.clone()),
    ];
    let http = agentserver::outbound::http_client()?.build()?;
    let samples = (threads / 10).max(100);
    let (mut a, mut b) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for i in 0..samples {
        if i % 2 == 0 {
            a.push(none.timed(&http, i).await?);
            b.push(keys.timed(&http, i).await?);
        } else {
            b.push(keys.timed(&http, i).await?);
            a.push(none.timed(&http, i).await?);
        }
    }
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut refused = 0;
    for bg in backgrounds {
        refused += bg.await?.1;
    }
    none.stop().await;
    keys.stop().await;
    // The median of each keyed request's time over the unkeyed one beside it.
    let paired = |part: fn(&(Duration, Duration)) -> Duration| {
        let mut pairs: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(a, b)| part(b).as_secs_f64() / part(a).as_secs_f64().max(1e-9))
            .collect();
        pairs.sort_by(f64::total_cmp);
        pairs.get(pairs.len() / 2).copied().unwrap_or(0.0)
    };
    let paired_median = paired(|t| t.1);
    let paired_accept = paired(|t| t.0);
    let accepted = |v: &[(Duration, Duration)]| Latencies(v.iter().map(|t| t.0).collect());
    let (mut accept_a, mut accept_b) = (accepted(&a), accepted(&b));
    let (mut a, mut b) = (
        Latencies(a.iter().map(|t| t.1).collect()),
        Latencies(b.iter().map(|t| t.1).collect()),
    );
    let ratio = |q: f64, a: &mut Latencies, b: &mut Latencies| b.ms(q) / a.ms(q);
    Ok(json!({
        "workload": match (control, keyed) {
            (_, true) => "rest-pair-keyed",
            (true, _) => "rest-pair-control",
            _ => "rest-pair",
        },
        "peak_hops_per_s": peak_hops.round(),
        "background_threads_per_s_each": per_tick * 1000,
        "background_refused": refused,
        "samples_each": samples,
        "none_ms": {"p50": a.ms(0.5), "p90": a.ms(0.9), "p99": a.ms(0.99), "accepted_p50": accept_a.ms(0.5)},
        "keys_ms": {"p50": b.ms(0.5), "p90": b.ms(0.9), "p99": b.ms(0.99), "accepted_p50": accept_b.ms(0.5)},
        "keys_over_none": {
            "paired_median": paired_median,
            "paired_median_accepted": paired_accept,
            "p50": ratio(0.5, &mut a, &mut b),
            "p90": ratio(0.9, &mut a, &mut b),
            "p99": ratio(0.99, &mut a, &mut b),
        },
    }))
}

/// What tenant acme does during a round of `tenants`.
#[derive(Clone, Copy, PartialEq)]
enum Acme {
    Quiet,
    AtLimit,
    OverLimit,
    /// As many requests as `OverLimit`, to `/healthz`: what sending and answering that many
    /// of the cheapest requests costs this machine.
    Floor,
}

/// Workload `tenants` (see the module's docs): rounds of `round_s` seconds, the three kinds
/// in turn, four times over (long enough for acme's burst to be spent and its rate to hold).
async fn tenants(round_s: f64) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    const LIMIT: usize = 500;
    let mut yaml = format!(
        "organism: {{ name: loadgen, store: data.db }}\nauth: {{ methods: [keys] }}\ntenants:\n  acme: {{ inject_per_s: {LIMIT} }}\nlisteners:\n"
    );
    for t in ["acme", "beta"] {
        yaml += &format!("  - {{ name: {t}-a, description: a, kind: lua, script: to.lua, schema: t.xsd, accepts: [Note], concurrency: 2, tenant: {t}, config: {{ to: {t}-c }} }}\n  - {{ name: {t}-c, description: c, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 2, tenant: {t} }}\n");
    }
    let (dir, organism) = start(&yaml)?;
    let config = Organism::builder().load_config(&dir.path().join("o.yaml"))?;
    let mut keys = Vec::new();
    for t in ["acme", "beta"] {
        let role = agentserver::access::Role::Operator;
        let (key, row) =
            agentserver::access::new_key(t, role, Some(t), None).map_err(|e| e.to_string())?;
        agentserver::access::KeySource::of(&config)?.add(&row)?;
        keys.push(key);
    }
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default()).await?;
    let url = format!("http://{}/api/v1/inject", server.local_addr());
    let http = agentserver::outbound::http_client()?.build()?;
    let noise_http = agentserver::outbound::http_client()?.build()?;
    let modes = [Acme::Quiet, Acme::AtLimit, Acme::OverLimit, Acme::Floor];
    let names = ["quiet", "at_limit", "over_limit", "healthz_floor"];
    let mut measured: [Vec<Duration>; 4] = Default::default();
    let mut acme_counts = [(0usize, 0usize, 0f64); 4];
    let health = url.replace("/api/v1/inject", "/healthz");
    for round in 0..modes.len() * 4 {
        let m = round % modes.len();
        let running = Arc::new(AtomicBool::new(true));
        let (accepted, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let rate = match modes[m] {
            Acme::Quiet => 0,
            Acme::AtLimit => LIMIT,
            Acme::OverLimit | Acme::Floor => 4 * LIMIT,
        };
        let floor = modes[m] == Acme::Floor;
        // acme: `rate` requests a second, sent every 2 ms, up to 64 in flight.
        let noise = {
            let (running, accepted, refused) = (running.clone(), accepted.clone(), refused.clone());
            let (http, key) = (noise_http.clone(), keys[0].clone());
            let url = if floor { health.clone() } else { url.clone() };
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(2));
                let in_flight = Arc::new(tokio::sync::Semaphore::new(64));
                let mut owed = 0.0;
                let mut n = 0;
                while rate > 0 && running.load(Ordering::Relaxed) {
                    tick.tick().await;
                    owed += rate as f64 * 0.002;
                    while owed >= 1.0 {
                        owed -= 1.0;
                        n += 1;
                        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                            continue;
                        };
                        let (http, url, key) = (http.clone(), url.clone(), key.clone());
                        let (accepted, refused) = (accepted.clone(), refused.clone());
                        let body = json!({"to": "acme-a", "payload_xml": payload(n)});
                        tokio::spawn(async move {
                            let r = if floor {
                                http.get(&url).send().await
                            } else {
                                http.post(&url).bearer_auth(key).json(&body).send().await
                            };
                            match r.map(|r| r.status().as_u16()) {
                                Ok(200 | 202) => accepted.fetch_add(1, Ordering::Relaxed),
                                _ => refused.fetch_add(1, Ordering::Relaxed),
                            };
                            drop(permit);
                        });
                    }
                }
            })
        };
        let started = Instant::now();
        let mut i = 0;
        while started.elapsed().as_secs_f64() < round_s {
            i += 1;
            let t0 = Instant::now();
            let r = http
                .post(&url)
                .bearer_auth(&keys[1])
                .json(&json!({"to": "beta-a", "payload_xml": payload(i)}))
                .send()
                .await?;
            if r.status().as_u16() != 202 {
                return Err(format!("beta's inject answered {}", r.status()).into());
            }
            let receipt: serde_json::Value = r.json().await?;
            organism
                .history()
                .wait_thread(receipt["thread_id"].as_str().unwrap_or_default())
                .await;
            measured[m].push(t0.elapsed());
        }
        let seconds = started.elapsed().as_secs_f64();
        running.store(false, Ordering::Relaxed);
        noise.await?;
        let c = &mut acme_counts[m];
        c.0 += accepted.load(Ordering::Relaxed);
        c.1 += refused.load(Ordering::Relaxed);
        c.2 += seconds;
    }
    organism.stop().await;
    server.shutdown().await;
    let mut lat: Vec<Latencies> = measured.into_iter().map(Latencies).collect();
    let quiet = [0.5, 0.9, 0.99].map(|q| lat[0].ms(q));
    let mut out = serde_json::Map::new();
    out.insert("workload".into(), json!("tenants"));
    out.insert("acme_inject_per_s".into(), json!(LIMIT));
    out.insert("round_s".into(), json!(round_s));
    for (m, name) in names.iter().enumerate() {
        let here = [0.5, 0.9, 0.99].map(|q| lat[m].ms(q));
        let (acc, refu, secs) = acme_counts[m];
        out.insert(
            (*name).into(),
            json!({
                "beta_samples": lat[m].0.len(),
                "beta_ms": {"p50": here[0], "p90": here[1], "p99": here[2]},
                "beta_over_quiet": {"p50": here[0] / quiet[0], "p90": here[1] / quiet[1], "p99": here[2] / quiet[2]},
                "acme_accepted_per_s": (acc as f64 / secs.max(1e-9)).round(),
                "acme_refused_per_s": (refu as f64 / secs.max(1e-9)).round(),
            }),
        );
    }
    Ok(serde_json::Value::Object(out))
}

/// Start-up to ready: load, check, compile, start every listener, bind and serve the API.
async fn startup() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("organisms/hello-world.yaml");
    let mut times = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let mut config = agentserver::config::load_file(
            &path,
            agentserver::config::Known {
                handlers: &["sink", "echo", "forward", "template"],
                check_script: agentserver::lua::check_syntax,
            },
        )?;
        config.store = None;
        let organism = Organism::builder().build(config)?;
        let server =
            ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default()).await?;
        times.push(started.elapsed());
        organism.stop().await;
        server.shutdown().await;
    }
    let mut t = Latencies(times);
    println!(
        "startup to ready (hello-world.yaml, 10 runs): p50 {:.1} ms, max {:.1} ms",
        t.ms(0.5),
        t.ms(1.0)
    );
    println!(
        "{}",
        json!({"workload": "startup", "p50_ms": t.ms(0.5), "max_ms": t.ms(1.0)})
    );
    Ok(())
}

/// Memory: the `chain` organism with the store on and retention keeping 100,000 messages,
/// driven through `millions` million logged messages (5 unless `--millions N`; at least 2,
/// a first and a last). The resident set size is read after each million
/// (`rss_mib_per_million`, as since the first release), and every 100 ms meanwhile: per
/// million, the median and the maximum of those readings.
/// A single reading lands at a random phase of the store writer's backlog and retention's
/// passes; the median is the level, the maximum the peak.
async fn rss(millions: u64) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let yaml = organism_yaml("chain").replace(
        "store: data.db }",
        "store: data.db, store_retention: { max_messages: 100000 } }",
    );
    let (_dir, organism) = start(&yaml)?;
    let readings = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let sampler = {
        let readings = readings.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                if let (Ok(kib), Ok(mut r)) = (resident_kib(), readings.lock()) {
                    r.push(kib);
                }
            }
        })
    };
    let (mut samples, mut medians, mut maxima) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    for million in 1..=millions.max(2) {
        // Each thread logs three messages (inject, a → b, b → c).
        while organism.info().total_messages < million * 1_000_000 {
            drive(&organism, 10_000, 3, None).await?;
        }
        let kib = resident_kib()?;
        let mut during = readings
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        during.push(kib);
        during.sort_unstable();
        let (median, max) = (during[during.len() / 2], during[during.len() - 1]);
        println!(
            "{million}M messages: RSS {:.1} MiB (median {:.1}, max {:.1}; {:.0} s, {} pruned so far)",
            mib(kib),
            mib(median),
            mib(max),
            started.elapsed().as_secs_f64(),
            organism.history().pruned_messages()
        );
        samples.push(kib);
        medians.push(median);
        maxima.push(max);
    }
    sampler.abort();
    let total = organism.info().total_messages;
    let rate = total as f64 / started.elapsed().as_secs_f64();
    let pruned = organism.history().pruned_messages();
    organism.stop().await;
    let growth = |v: &[u64]| {
        let (first, last) = (v[0] as f64, v[v.len() - 1] as f64);
        ((last - first) / first * 1000.0).round() / 1000.0
    };
    let mibs = |v: &[u64]| {
        v.iter()
            .map(|k| (mib(*k) * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    };
    Ok(json!({
        "workload": "rss",
        "retention_max_messages": 100_000,
        "messages_per_s": rate.round(),
        "messages_pruned": pruned,
        "messages_kept_at_end": total.saturating_sub(pruned),
        "rss_mib_per_million": mibs(&samples),
        "rss_median_mib_per_million": mibs(&medians),
        "rss_max_mib_per_million": mibs(&maxima),
        "growth_first_to_last": growth(&samples),
        "median_growth_first_to_last": growth(&medians),
    }))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// This process's resident set size in KiB (Linux `/proc/self/status`).
fn resident_kib() -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// A running server: closed-loop REST injects (`--concurrency` at once) against `--url`, each
/// timed from the POST to its thread's `thread_updated` event with a final status on `/ws`.
async fn remote(
    base: &str,
    to: &str,
    payload: &str,
    threads: usize,
    concurrency: usize,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    use futures_util::StreamExt;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use tokio::sync::oneshot;

    enum Seen {
        Done,
        Waiting(oneshot::Sender<()>),
    }
    let base = base.trim_end_matches('/');
    let ws_url = format!(
        "{}/ws?events=thread_updated",
        base.replacen("http", "ws", 1)
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(&ws_url).await?;
    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(Ok(frame)) = ws.next().await {
                let tokio_tungstenite::tungstenite::Message::Text(t) = frame else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) else {
                    continue;
                };
                if v["event"] != "thread_updated" || v["status"] == "active" {
                    continue;
                }
                let Some(id) = v["thread_id"].as_str() else {
                    continue;
                };
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                match seen.remove(id) {
                    Some(Seen::Waiting(tx)) => {
                        let _ = tx.send(());
                    }
                    _ => {
                        seen.insert(id.to_string(), Seen::Done);
                    }
                }
            }
        })
    };

    let http = agentserver::outbound::http_client()
        .unwrap()
        .build()
        .unwrap();
    let url = format!("{base}/api/v1/inject");
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (http, url, next, seen) = (http.clone(), url.clone(), next.clone(), seen.clone());
        let body = json!({"to": to, "payload_xml": payload});
        workers.spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < threads {
                let sent = Instant::now();
                let r = http
                    .post(&url)
                    .json(&body)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = r.status();
                let receipt: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
                if status.as_u16() != 202 {
                    return Err(format!("inject answered {status}: {receipt}"));
                }
                let id = receipt["thread_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let wait = {
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    match seen.remove(&id) {
                        Some(Seen::Done) => None,
                        _ => {
                            let (tx, rx) = oneshot::channel();
                            seen.insert(id, Seen::Waiting(tx));
                            Some(rx)
                        }
                    }
                };
                if let Some(rx) = wait {
                    tokio::time::timeout(Duration::from_secs(30), rx)
                        .await
                        .map_err(|_| "a thread did not finish within 30 s".to_string())?
                        .map_err(|_| "the event stream closed".to_string())?;
                }
                latencies.push(sent.elapsed());
            }
            Ok::<_, String>(latencies)
        });
    }
    let mut all = Vec::with_capacity(threads);
    while let Some(r) = workers.join_next().await {
        all.extend(r??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    reader.abort();
    let mut lat = Latencies(all);
    Ok(json!({
        "workload": "remote",
        "url": base,
        "threads": threads,
        "concurrency": concurrency,
        "threads_per_s": (threads as f64 / elapsed).round(),
        "latency_ms": {"p50": lat.ms(0.5), "p90": lat.ms(0.9), "p99": lat.ms(0.99), "max": lat.ms(1.0)},
    }))
}

/// Command-line options: positional `WORKLOAD [THREADS]`, then `--pace N`, `--url URL`,
/// `--to NAME`, `--payload XML`, `--concurrency N`, `--workers N`, `--driver-thread`,
/// `--millions N`, `--bytes N` (pad each generated payload to about N bytes).
struct Args {
    workload: String,
    threads: usize,
    pace: Option<f64>,
    url: Option<String>,
    to: String,
    payload: String,
    concurrency: usize,
    workers: usize,
    driver_thread: bool,
    millions: u64,
    bytes: Option<usize>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut a = Args {
            workload: "all".into(),
            threads: 20_000,
            pace: None,
            url: None,
            to: "greeter".into(),
            payload: "<Greeting><name>loadgen</name></Greeting>".into(),
            concurrency: 32,
            workers: 2,
            driver_thread: false,
            millions: 5,
            bytes: None,
        };
        let mut positional = 0;
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
            match arg.as_str() {
                "--pace" => a.pace = Some(number(&value("--pace")?)?),
                "--url" => a.url = Some(value("--url")?),
                "--to" => a.to = value("--to")?,
                "--payload" => a.payload = value("--payload")?,
                "--concurrency" => a.concurrency = number(&value("--concurrency")?)? as usize,
                "--workers" => a.workers = number(&value("--workers")?)? as usize,
                "--driver-thread" => a.driver_thread = true,
                "--millions" => a.millions = number(&value("--millions")?)? as u64,
                "--bytes" => a.bytes = Some(number(&value("--bytes")?)? as usize),
                flag if flag.starts_with("--") => return Err(format!("unknown option `{flag}`")),
                _ if positional == 0 => {
                    a.workload = arg;
                    positional += 1;
                }
                _ if positional == 1 => {
                    a.threads = number(&arg)? as usize;
                    positional += 1;
                }
                _ => return Err(format!("unexpected argument `{arg}`")),
            }
        }
        Ok(a)
    }
}

fn number(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|n| *n > 0.0)
        .ok_or(format!("`{s}` is not a positive number"))
}

fn print_latency(label: &str, r: &serde_json::Value) {
    let l = &r["latency_ms"];
    let ms = |q: &str| l[q].as_f64().unwrap_or(0.0);
    println!(
        "{label}: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms("p50"),
        ms("p90"),
        ms("p99"),
        ms("max")
    );
    println!("{r}");
}

/// Where a workload's driver runs (see the module doc).
struct Driver<'a> {
    rt: &'a tokio::runtime::Runtime,
    on_main_thread: bool,
}

impl Driver<'_> {
    /// Runs `fut` to completion: as a task on the runtime's workers, or with
    /// `--driver-thread` on the calling (main) thread.
    fn run<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, Box<dyn std::error::Error>>> + Send + 'static,
    ) -> Result<T, Box<dyn std::error::Error>> {
        if self.on_main_thread {
            return self.rt.block_on(fut);
        }
        let task = self
            .rt
            .spawn(async move { fut.await.map_err(|e| e.to_string()) });
        Ok(self.rt.block_on(task)??)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: first thing in the process, as the `agentserver` binary does.
    unsafe { agentserver::schema::use_mimalloc_for_libxml2() };
    agentserver::disable_transparent_huge_pages();
    let args = Args::parse()?;
    if let Some(n) = args.bytes {
        let base = payload(0).len();
        let _ = PAD.set("x".repeat(n.saturating_sub(base)));
    }
    // The organism's own warnings and errors (a failing store, a refused reload) on stderr.
    agentserver::log_to_stderr();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()?;
    let driver = Driver {
        rt: &rt,
        on_main_thread: args.driver_thread,
    };
    let threads = args.threads;
    match args.workload.as_str() {
        "startup" => return driver.run(startup()),
        "rss" => {
            let millions = args.millions;
            println!("{}", driver.run(rss(millions))?);
            return Ok(());
        }
        w @ ("rest" | "rest-memory" | "rest-auth") => {
            let chain = if w == "rest-memory" {
                "chain-memory"
            } else {
                "chain"
            };
            let r = driver.run(rest(threads, chain, w == "rest-auth"))?;
            let label = format!(
                "{w}: {} samples at {} background threads/s (half of peak {} hops/s)",
                r["samples"], r["background_threads_per_s"], r["peak_hops_per_s"]
            );
            print_latency(&label, &r);
            return Ok(());
        }
        "tenants" => {
            println!("{}", driver.run(tenants(3.0))?);
            return Ok(());
        }
        w @ ("rest-pair" | "rest-pair-control" | "rest-pair-keyed") => {
            let (control, keyed) = (w == "rest-pair-control", w == "rest-pair-keyed");
            println!("{}", driver.run(rest_pair(threads, control, keyed))?);
            return Ok(());
        }
        "remote" => {
            let url = args
                .url
                .as_deref()
                .ok_or("`remote` needs --url http://HOST:PORT (a running `agentserver run`)")?;
            let (to, payload, target) = (args.to.clone(), args.payload.clone(), url.to_string());
            let r = driver.run(async move {
                remote(&target, &to, &payload, threads, args.concurrency).await
            })?;
            let label = format!(
                "remote {url}: {} threads/s, {} in flight",
                r["threads_per_s"], r["concurrency"]
            );
            print_latency(&label, &r);
            return Ok(());
        }
        _ => {}
    }
    let workloads: Vec<&str> = match args.workload.as_str() {
        "all" => vec!["chain", "chain-memory", "lua", "fanout", "ws50"],
        w @ ("chain" | "chain-memory" | "lua" | "fanout" | "ws50" | "ws50-auth") => vec![w],
        other => {
            return Err(format!(
                "unknown workload `{other}` (chain, chain-memory, lua, fanout, ws50, ws50-auth, all, rest, rest-memory, rest-auth, rest-pair, rest-pair-control, rest-pair-keyed, tenants, \
                 remote, rss, startup)"
            )
            .into())
        }
    };
    println!("workload         hops/s   p50 ms   p90 ms   p99 ms   max ms   ceiling/s   ratio");
    for w in workloads {
        let (workload, pace) = (w.to_string(), args.pace);
        let mut r = driver.run(async move { run(&workload, threads, pace).await })?;
        r["driver"] = json!(if args.driver_thread {
            "main thread"
        } else {
            "runtime"
        });
        r["workers"] = json!(args.workers.max(1));
        let l = &r["latency_ms"];
        println!(
            "{w:14} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>11} {:>7}",
            r["hops_per_s"],
            l["p50"].as_f64().unwrap_or(0.0),
            l["p90"].as_f64().unwrap_or(0.0),
            l["p99"].as_f64().unwrap_or(0.0),
            l["max"].as_f64().unwrap_or(0.0),
            r["ceiling_validations_per_s"],
            r["ratio_to_ceiling"]
        );
        println!(
            "{:14} libxml2 parse + validate alone: {}/s, ratio {}",
            "", r["ceiling_libxml2_per_s"], r["ratio_to_libxml2_ceiling"]
        );
        if let Some(us) = r["store_writer_cpu_us_per_message"].as_f64() {
            println!("{:14} store writer: {us} µs of CPU per logged message", "");
        }
        println!("{r}");
    }
    Ok(())
}
