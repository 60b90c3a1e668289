//! The event stream mirrored to NATS JetStream: a real `nats-server -js` on a loopback port,
//! the pump (with a store) in this process mirroring its events, a real `agentserver
//! gateway` process serving `/ws/messages` from the stream, and `agentserver restore`
//! rebuilding a store file from it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::store::Store;
use agentserver::threads::{MessageFilter, Page};
use agentserver::Organism;
use common::child::{self, Running};
use common::*;
use serde_json::Value;

struct Nats {
    port: u16,
    _dir: tempfile::TempDir,
    _process: Running,
}

impl Nats {
    fn start() -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let bin = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("nats-server");
        let process = Running::spawn(
            Command::new(bin)
                .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        wait_until("nats-server to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Nats {
            port,
            _dir: dir,
            _process: process,
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn prefix(&self) -> String {
        format!("m{}", self.port)
    }
}

fn organism_file(dir: &Path, nats: &Nats) -> PathBuf {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let yaml = format!(
        "organism:
  name: mirrored
  store: o.db
  nats: {{url: {}, stream_prefix: {}}}
listeners:
{CHAIN}
",
        nats.url(),
        nats.prefix()
    );
    let path = dir.join("o.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn gateway(nats: &Nats) -> (Running, String) {
    let mut cmd = child::agentserver();
    cmd.args(["gateway", "--nats", &nats.url(), "--stream-prefix"])
        .arg(nats.prefix())
        .args(["--listen", "127.0.0.1:0"]);
    let (process, url) = child::serve(cmd, Stdio::null());
    (process, url.replace("http://", "ws://"))
}

/// Frames of `/ws/messages` until the one saying the note to `c` in `thread` was delivered.
async fn frames_until_done(ws: &mut Ws, thread: &str) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let f = next_json(ws).await;
        let done = f["event"] == "message_status"
            && f["thread_id"] == thread
            && f["to"] == "c"
            && f["status"] == "delivered";
        frames.push(f);
        if done {
            return frames;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_serves_the_pumps_message_stream_and_restore_rebuilds_its_store() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats);
    let o = Organism::builder().load(&path).unwrap();
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let stop_mirror = tokio_util::sync::CancellationToken::new();
    let mirror = tokio::spawn(agentserver::api::mirror_events(
        o.clone(),
        stop_mirror.clone(),
    ));
    // Something in the stream before the gateway starts: it loads what it holds.
    let first = inject(&o, "a", "<Note>before the gateway</Note>", None);
    settle(&o, &first.thread_id).await;
    let (_gateway, gw) = gateway(&nats);

    let filter = "/ws/messages?agents=b";
    let mut at_pump = ws_connect(&format!("ws://{}{filter}", server.local_addr())).await;
    let mut at_gateway = ws_connect(&format!("{gw}{filter}")).await;
    // Both sessions are subscribed once their upgrades are answered: every event of the
    // traffic below reaches the gateway after that, through the pump's mirror and NATS.
    let mut threads = Vec::new();
    for i in 0..10 {
        let r = inject(&o, "a", &format!("<Note>n{i}</Note>"), None);
        threads.push(r.thread_id.to_string());
    }
    let last = threads.last().unwrap().clone();
    let pump_frames = frames_until_done(&mut at_pump, &last).await;
    let gateway_frames = frames_until_done(&mut at_gateway, &last).await;
    // The gateway may have connected a little later: it is a tail of the pump's run...
    let start = pump_frames
        .iter()
        .position(|f| f["seq"] == gateway_frames[0]["seq"])
        .expect("the gateway's first frame is one the pump sent");
    assert_eq!(&pump_frames[start..], &gateway_frames[..]);
    assert!(pump_frames.len() >= 40, "{}", pump_frames.len());

    // ...and resumes with `since` exactly as the pump does.
    let since = pump_frames[7]["seq"].as_u64().unwrap();
    let mut resumed = ws_connect(&format!("{gw}{filter}&since={since}")).await;
    let mut resumed_at_pump = ws_connect(&format!(
        "ws://{}{filter}&since={since}",
        server.local_addr()
    ))
    .await;
    let a = frames_until_done(&mut resumed, &last).await;
    let b = frames_until_done(&mut resumed_at_pump, &last).await;
    assert_eq!(a, b);
    assert_eq!(a[0]["seq"], pump_frames[8]["seq"]);

    // Resuming from before what the gateway holds: resync_required, as at the pump.
    let mut too_old = ws_connect(&format!("{gw}{filter}&since=999999999")).await;
    let f = next_json(&mut too_old).await;
    assert_eq!(f["event"], "resync_required", "{f}");

    // Restore: the pump's store and one rebuilt from the stream hold the same log.
    drop((at_pump, at_gateway, resumed, resumed_at_pump, too_old));
    server.shutdown().await;
    o.stop().await;
    stop_mirror.cancel();
    mirror.await.unwrap().unwrap();
    drop(o);
    let restored = dir.path().join("restored.db");
    let out = child::run_to_exit([
        "restore".as_ref(),
        "--from-nats".as_ref(),
        "--nats".as_ref(),
        nats.url().as_ref(),
        "--stream-prefix".as_ref(),
        nats.prefix().as_ref(),
        "--store".as_ref(),
        restored.as_os_str(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(33 messages)"), "{stdout}");
    let page = Page {
        limit: 1000,
        offset: 0,
    };
    let original = Store::open(&dir.path().join("o.db"))
        .unwrap()
        .query_messages(&MessageFilter::default(), page)
        .unwrap();
    let rebuilt = Store::open(&restored)
        .unwrap()
        .query_messages(&MessageFilter::default(), page)
        .unwrap();
    assert_eq!(original.total, 33);
    assert_eq!(rebuilt.total, original.total);
    let key = |m: &agentserver::threads::MessageRecord| {
        (m.id.to_string(), m.status, m.payload_xml.to_string())
    };
    assert_eq!(
        rebuilt.items.iter().map(key).collect::<Vec<_>>(),
        original.items.iter().map(key).collect::<Vec<_>>()
    );

    // A second restore to the same file is refused: it never overwrites.
    let again = child::run_to_exit([
        "restore".as_ref(),
        "--from-nats".as_ref(),
        "--nats".as_ref(),
        nats.url().as_ref(),
        "--stream-prefix".as_ref(),
        nats.prefix().as_ref(),
        "--store".as_ref(),
        restored.as_os_str(),
    ]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
}
