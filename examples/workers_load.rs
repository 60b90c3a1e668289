//! Measures listeners placed on workers (docs/benchmarks-log.md, "Workers"), against a real
//! `nats-server -js` it starts on a loopback port and real `agentserver worker` processes
//! (the release binary next to this example: `cargo build --release` first).
//!
//! ```text
//! cargo build --release && cargo run --release --example workers_load -- hop [ROUNDS]
//! cargo run --release --example workers_load -- scale io|cpu [ROUNDS]
//! cargo run --release --example workers_load -- gateway [ROUNDS] [READERS]
//! ```
//!
//! `hop`: one message at a time through `relay` (forward to a sink), in-process and placed on
//! one worker, in alternating rounds; the latency from inject to the thread's end, p50/p99.
//! `scale io`: `relay` waits 10 ms (`delay`); `scale cpu`: `relay` is a Lua loop of about
//! several ms of CPU. Each round runs 1, 2 and 4 worker processes in turn (A B C A B C …) under a
//! closed loop of 256 threads, and counts the messages through per second.
//! `gateway`: the pump (a → b → c, in-process, its events mirrored to NATS) under a closed
//! loop, in rounds that alternate no observers and READERS (default 500) `/ws/messages`
//! clients of an `agentserver gateway` process (the clients in another process of this
//! example); the pump's hops per second in each. With `PIN=1` in the environment the
//! pump's process keeps to CPU 0 and NATS, the gateway and the readers to CPU 1 (a stand-in
//! for observers on other machines: run the example itself under `taskset -c 0`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentserver::{InjectRequest, Organism};

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Note" type="xs:string"/>
</xs:schema>"#;
/// A few milliseconds of CPU (400,000 turns of a Luau loop), then on to the collector.
const BUSY_LUA: &str = "function handle(p, m)\n  local x = 0\n  for i = 1, 400000 do x = x + i % 7 end\n  return { to = 'collector', type = 'Note', payload = p }\nend\n";
const WINDOW: usize = 256;

type BoxError = Box<dyn std::error::Error>;

/// `program`, on CPU 1 only when `PIN=1` (see the module's doc).
fn spawned(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if std::env::var("PIN").is_ok_and(|v| v == "1") {
        let mut c = Command::new("taskset");
        c.args(["-c", "1"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

struct Nats {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nats() -> Result<Nats, BoxError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let dir = tempfile::tempdir()?;
    let bin = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .iter()
        .find(|p| Path::new(p).exists())
        .copied()
        .unwrap_or("nats-server");
    let child = spawned(bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("nats-server did not listen".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Nats {
        child,
        url: format!("nats://127.0.0.1:{port}"),
        _dir: dir,
    })
}

fn binary() -> Result<PathBuf, BoxError> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("no target directory")?;
    let bin = dir.join("agentserver");
    if !bin.exists() {
        return Err(format!("{} is missing: cargo build --release", bin.display()).into());
    }
    Ok(bin)
}

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn workers(path: &Path, n: usize, slots: usize) -> Result<Workers, BoxError> {
    let bin = binary()?;
    let mut children = Vec::new();
    for i in 0..n {
        children.push(
            Command::new(&bin)
                .arg("worker")
                .arg(path)
                .args(["--listeners", "relay", "--name", &format!("w{i}")])
                .args(["--concurrency", &slots.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
    }
    Ok(Workers(children))
}

/// The organism: `relay` (`relay_handler`, placed on workers or not) on to `collector`, and
/// `local` (a forward in-process) on to `collector`, for the in-process baseline.
fn organism(dir: &Path, nats: &Nats, relay_handler: &str) -> Result<(PathBuf, Organism), BoxError> {
    std::fs::write(dir.join("t.xsd"), XSD)?;
    std::fs::write(dir.join("busy.lua"), BUSY_LUA)?;
    let yaml = format!(
        "organism:
  name: workers-load
  store: memory
  nats: {{url: {}, deliver_timeout_ms: 60000}}
limits: {{max_concurrent_handlers: 512, max_pending_messages: 100000}}
listeners:
  - {{name: relay, description: placed, {relay_handler}, schema: t.xsd, accepts: [Note], peers: [collector], concurrency: 256, placement: workers}}
  - {{name: local, description: in-process, kind: native, handler: forward, config: {{to: collector}}, schema: t.xsd, accepts: [Note], peers: [collector], concurrency: 256}}
  - {{name: collector, description: sink, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 256}}
",
        nats.url
    );
    let path = dir.join("o.yaml");
    std::fs::write(&path, yaml)?;
    let o = Organism::builder().load(&path)?;
    Ok((path, o))
}

async fn one(o: &Organism, to: &str, i: u64) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let r = o.inject(InjectRequest {
        from: "api".into(),
        to: to.into(),
        payload_xml: format!("<Note>n{i}</Note>"),
        thread_id: None,
    })?;
    o.history().wait_thread(&r.thread_id).await;
    Ok(started.elapsed())
}

fn quantile(v: &mut [Duration], q: f64) -> f64 {
    v.sort_unstable();
    let i = ((v.len() as f64 * q).ceil() as usize).saturating_sub(1);
    v.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

async fn wait_served(o: &Organism) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !o.metrics().unserved_listeners().is_empty() {
        if Instant::now() > deadline {
            return Err("no worker announced itself".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn hop(rounds: usize) -> Result<(), BoxError> {
    let nats = nats()?;
    let dir = tempfile::tempdir()?;
    let (path, o) = organism(
        dir.path(),
        &nats,
        "kind: native, handler: forward, config: {to: collector}",
    )?;
    let _w = workers(&path, 1, 16)?;
    wait_served(&o).await?;
    let (mut local, mut placed) = (Vec::new(), Vec::new());
    let mut i = 0;
    for _ in 0..20 {
        one(&o, "relay", i).await?;
        i += 1;
    }
    for _ in 0..rounds {
        for _ in 0..200 {
            local.push(one(&o, "local", i).await?);
            i += 1;
        }
        for _ in 0..200 {
            placed.push(one(&o, "relay", i).await?);
            i += 1;
        }
    }
    let (l50, l99) = (quantile(&mut local, 0.5), quantile(&mut local, 0.99));
    let (p50, p99) = (quantile(&mut placed, 0.5), quantile(&mut placed, 0.99));
    println!(
        "{}",
        serde_json::json!({
            "workload": "hop", "rounds": rounds, "messages_each": local.len(),
            "in_process_ms": {"p50": l50, "p99": l99},
            "on_a_worker_ms": {"p50": p50, "p99": p99},
            "added_ms": {"p50": p50 - l50, "p99": p99 - l99},
        })
    );
    Ok(())
}

/// Messages per second into `to`, each counted `weight` times (the messages of its thread),
/// under a closed loop of [`WINDOW`] threads for `seconds`.
async fn closed_loop(o: &Organism, to: &str, weight: u64, seconds: f64) -> Result<f64, BoxError> {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for k in 0..WINDOW {
        let (o, done, to) = (o.clone(), done.clone(), to.to_string());
        tasks.push(tokio::spawn(async move {
            let mut i = k as u64 * 1_000_000;
            while Instant::now() < until {
                if one(&o, &to, i).await.is_ok() {
                    done.fetch_add(weight, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Messages through `relay` per second.
async fn throughput(o: &Organism, seconds: f64) -> Result<f64, BoxError> {
    closed_loop(o, "relay", 1, seconds).await
}

async fn scale(kind: &str, rounds: usize) -> Result<(), BoxError> {
    let nats = nats()?;
    let dir = tempfile::tempdir()?;
    let (handler, slots) = match kind {
        "io" => (
            "kind: native, handler: delay, config: {ms: 10, to: collector}",
            32,
        ),
        "cpu" => ("kind: lua, script: busy.lua", 2),
        other => return Err(format!("unknown workload `{other}` (io or cpu)").into()),
    };
    let (path, o) = organism(dir.path(), &nats, handler)?;
    let counts = [1usize, 2, 4];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); counts.len()];
    for _ in 0..rounds {
        for (k, n) in counts.iter().enumerate() {
            let w = workers(&path, *n, slots)?;
            wait_served(&o).await?;
            throughput(&o, 1.0).await?;
            rates[k].push(throughput(&o, 4.0).await?);
            drop(w);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let m: Vec<f64> = rates.iter_mut().map(median).collect();
    println!(
        "{}",
        serde_json::json!({
            "workload": format!("scale-{kind}"), "rounds": rounds, "slots_per_worker": slots,
            "msgs_per_s_median": {"1": m[0], "2": m[1], "4": m[2]},
            "ratio_to_one": {"2": m[1] / m[0], "4": m[2] / m[0]},
            "all_rounds": rates,
        })
    );
    Ok(())
}

/// Messages through the chain a → b → c per second (3 a thread).
async fn chain_rate(o: &Organism, seconds: f64) -> Result<f64, BoxError> {
    closed_loop(o, "a", 3, seconds).await
}

/// Lines of a child's stdout, on a channel.
fn lines_of(child: &mut Child) -> Result<std::sync::mpsc::Receiver<String>, BoxError> {
    use std::io::BufRead;
    let out = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Ok(rx)
}

async fn gateway(rounds: usize, readers: usize) -> Result<(), BoxError> {
    let nats = nats()?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("t.xsd"), XSD)?;
    let yaml = format!(
        "organism:
  name: gateway-load
  store: memory
  nats: {{url: {}, stream_prefix: gwload}}
limits: {{max_pending_messages: 100000}}
listeners:
  - {{name: a, description: a, kind: native, handler: forward, config: {{to: b}}, schema: t.xsd, accepts: [Note], concurrency: 2}}
  - {{name: b, description: b, kind: native, handler: forward, config: {{to: c}}, schema: t.xsd, accepts: [Note], concurrency: 2}}
  - {{name: c, description: c, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 2}}
",
        nats.url
    );
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, yaml)?;
    let o = Organism::builder().load(&path)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mirror = tokio::spawn(agentserver::api::mirror_events(o.clone(), stop.clone()));
    let mut gw = Workers(vec![spawned(binary()?)
        .args(["gateway", "--nats", &nats.url, "--stream-prefix", "gwload"])
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?]);
    let gw_lines = lines_of(&mut gw.0[0])?;
    let url = loop {
        let line = gw_lines.recv_timeout(Duration::from_secs(20))?;
        if let Some(u) = line.strip_prefix("agentserver listening on http://") {
            break format!("ws://{u}/ws/messages");
        }
    };
    chain_rate(&o, 1.0).await?;
    let (mut alone, mut observed, mut delivered) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        alone.push(chain_rate(&o, 4.0).await?);
        let mut r = Workers(vec![spawned(std::env::current_exe()?)
            .args(["readers", &url, &readers.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?]);
        let lines = lines_of(&mut r.0[0])?;
        loop {
            if lines.recv_timeout(Duration::from_secs(60))? == "connected" {
                break;
            }
        }
        let before = lines
            .try_iter()
            .filter_map(|l| l.parse::<u64>().ok())
            .last()
            .unwrap_or(0);
        observed.push(chain_rate(&o, 4.0).await?);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let after = lines
            .try_iter()
            .filter_map(|l| l.parse::<u64>().ok())
            .last()
            .unwrap_or(0);
        delivered.push(after.saturating_sub(before));
        drop(r);
    }
    stop.cancel();
    let _ = mirror.await;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut alone.clone()), median(&mut observed.clone()));
    println!(
        "{}",
        serde_json::json!({
            "workload": "gateway", "rounds": rounds, "readers": readers,
            "pump_hops_per_s_alone": alone, "pump_hops_per_s_observed": observed,
            "median_ratio": b / a,
            "frames_delivered_to_readers_per_round": delivered,
        })
    );
    Ok(())
}

/// `readers URL N`: N WebSocket clients of URL; prints `connected`, then the frames they
/// received in all, every half second.
async fn readers(url: &str, n: usize) -> Result<(), BoxError> {
    use futures_util::StreamExt;
    let frames = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..n {
        let (ws, _) = tokio_tungstenite::connect_async(url).await?;
        clients.push(ws);
    }
    println!("connected");
    for mut ws in clients {
        let frames = frames.clone();
        tokio::spawn(async move {
            while let Some(Ok(_)) = ws.next().await {
                frames.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        println!("{}", frames.load(Ordering::Relaxed));
    }
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match args.first().map(String::as_str) {
        Some("hop") => {
            let rounds = args.get(1).map_or(Ok(5), |r| r.parse())?;
            rt.block_on(hop(rounds))
        }
        Some("scale") => {
            let kind = args.get(1).map_or("io", String::as_str);
            let rounds = args.get(2).map_or(Ok(3), |r| r.parse())?;
            rt.block_on(scale(kind, rounds))
        }
        Some("gateway") => {
            let rounds = args.get(1).map_or(Ok(3), |r| r.parse())?;
            let readers = args.get(2).map_or(Ok(500), |r| r.parse())?;
            rt.block_on(gateway(rounds, readers))
        }
        Some("readers") => {
            let url = args.get(1).ok_or("readers URL N")?;
            let n = args.get(2).map_or(Ok(500), |r| r.parse())?;
            rt.block_on(readers(url, n))
        }
        _ => Err(
            "usage: workers_load hop [ROUNDS] | scale io|cpu [ROUNDS] | gateway [ROUNDS] [READERS]"
                .into(),
        ),
    }
}
