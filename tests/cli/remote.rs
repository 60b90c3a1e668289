//! `agentserver run` serving the API, and the `inject` and `tail` commands against it: real
//! processes, real sockets.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::child;
use child::{agentserver, wait_exit, wait_until, Running, WAIT};
use std::sync::mpsc;

/// Spawns a command and forwards its stdout lines to a channel (stderr goes where the
/// command says: inherited unless set).
pub(crate) fn spawn_lines(mut cmd: Command) -> (Running, mpsc::Receiver<String>) {
    let mut child = Running::spawn(cmd.stdout(Stdio::piped()));
    let stdout = child.stdout.take().unwrap();
    (child, lines_of(stdout))
}

/// The lines a process writes to one of its pipes, as they come.
pub(crate) fn lines_of(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

pub(crate) fn line_matching(rx: &mpsc::Receiver<String>, pred: impl Fn(&str) -> bool) -> String {
    loop {
        let line = rx.recv_timeout(WAIT).expect("the expected line in time");
        if pred(&line) {
            return line;
        }
    }
}

/// A thread's messages, as the API lists them.
pub(crate) fn messages_of(url: &str, thread: &str) -> Vec<serde_json::Value> {
    let url = format!("{url}/api/v1/threads/{thread}/messages");
    let page: serde_json::Value =
        block_on(async { http_get(url).await.unwrap().json().await.unwrap() });
    page["items"].as_array().cloned().unwrap_or_default()
}

/// Runs one HTTP exchange from these synchronous tests.
fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn metrics(url: &str) -> String {
    block_on(async {
        http_get(format!("{url}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
}

/// `POST /api/v1/organism/stop`; returns the status.
pub(crate) fn stop(url: &str) -> u16 {
    block_on(async {
        agentserver::outbound::http_client()
            .unwrap()
            .build()
            .unwrap()
            .post(format!("{url}/api/v1/organism/stop"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    })
}

#[test]
fn run_serves_the_api_tail_follows_inject_posts_and_stop_exits_0() {
    let (mut server, url) = run_demo();
    assert!(!url.ends_with(":0"), "the real port is printed: {url}");

    let mut tail = agentserver();
    tail.args(["tail", "--url", &url, "--agent", "shout*"])
        .stderr(Stdio::piped());
    let (mut tail, tail_lines) = spawn_lines(tail);
    let tail_errors = lines_of(tail.stderr.take().unwrap());
    wait_until("tail connects", || {
        metrics(&url).contains("agentserver_ws_clients{endpoint=\"/ws/messages\"} 1")
    });

    let out = agentserver()
        .args([
            "inject",
            "--url",
            &url,
            "--to",
            "greeter",
            "<Greeting><name>Ada</name></Greeting>",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let thread = receipt["thread_id"].as_str().unwrap().to_string();
    assert!(receipt["message_id"].as_str().is_some());

    // Each message, then its final status on a line of its own (or in the message's line,
    // when it came while the server held the message's frame); full thread ids.
    let first = line_matching(&tail_lines, |_| true);
    assert!(
        first.contains(&format!(
            "{thread} #1   greeter -> shouter GreetingResponse ["
        )),
        "{first}"
    );
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|l: &String| l.contains("shouter -> response-handler Shouted [delivered]"))
    {
        seen.push(line_matching(&tail_lines, |_| true));
    }
    seen.push(first);
    assert!(
        seen.iter()
            .any(|l| l.contains("greeter -> shouter GreetingResponse [delivered]")),
        "{seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.contains("shouter -> response-handler Shouted [")
                && l.contains("HELLO, ADA!")),
        "{seen:#?}"
    );

    // JSON payloads map in schema order; a bad one is refused with the server's reason.
    // Labels go with the thread; one not `KEY=VALUE` is the command's refusal (exit 2).
    let out = agentserver()
        .args([
            "inject",
            "--url",
            &url,
            "--to",
            "greeter",
            "--label",
            "customer=acme-42",
            "--label",
            "tier=gold",
            r#"{"name": "Bo"}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let labelled: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let thread_url = format!(
        "{url}/api/v1/threads/{}",
        labelled["thread_id"].as_str().unwrap()
    );
    let shown: serde_json::Value =
        block_on(async { http_get(thread_url).await.unwrap().json().await.unwrap() });
    assert_eq!(
        shown["labels"],
        serde_json::json!({"customer": "acme-42", "tier": "gold"})
    );
    let out = agentserver()
        .args([
            "inject",
            "--url",
            &url,
            "--to",
            "greeter",
            "--label",
            "oops",
            "<Greeting/>",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = agentserver()
        .args(["inject", "--url", &url, "--to", "greeter", "<Greeting/>"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("422") && stderr.contains("invalid_payload"),
        "{stderr}"
    );

    // One thread's tail starts from its history.
    let mut follow = agentserver();
    follow.args(["tail", "--url", &url, "--thread", &thread]);
    let (follow, follow_lines) = spawn_lines(follow);
    let history = line_matching(&follow_lines, |l| l.contains("-> response-handler"));
    assert!(
        history.contains(&format!("{thread} #2")) && history.contains("HELLO, ADA!"),
        "{history}"
    );
    drop(follow);

    // With an idempotency key, a retry runs once; the key with another payload is refused.
    let keyed = |payload: &str| {
        agentserver()
            .args([
                "inject",
                "--url",
                &url,
                "--to",
                "greeter",
                "--idempotency-key",
                "cli-1",
                payload,
            ])
            .output()
            .unwrap()
    };
    let receipts: Vec<serde_json::Value> = (0..2)
        .map(|_| {
            let out = keyed(r#"{"name": "Cy"}"#);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect();
    assert_eq!(receipts[0]["thread_id"], receipts[1]["thread_id"]);
    let out = keyed(r#"{"name": "Di"}"#);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("idempotency_conflict"), "{stderr}");

    // Stop through the API: the server drains and exits 0; tail says the stream ended and
    // exits 1.
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
    assert_eq!(wait_exit(&mut tail), Some(1));
    let said = line_matching(&tail_errors, |l| l.contains("ended the stream"));
    assert!(said.contains("server stopping"), "{said}");
}

/// `agentserver run` on the demo organism, on port 0, with `--store STORE`.
fn demo(store: &str) -> Command {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/hello-world.yaml");
    let mut run = agentserver();
    run.args(["run", demo, "--listen", "127.0.0.1:0", "--store", store]);
    run
}

/// Starts the demo with `store: memory`; returns the process and its URL.
pub(crate) fn run_demo() -> (Running, String) {
    run_demo_on("memory")
}

/// [`run_demo`] with the given `--store`.
fn run_demo_on(store: &str) -> (Running, String) {
    child::serve(demo(store), Stdio::inherit())
}

#[test]
fn tail_warns_about_an_agent_glob_that_matches_no_agent_and_keeps_following() {
    let (mut server, url) = run_demo();
    let mut tail = agentserver();
    tail.args(["tail", "--url", &url, "--agent", "gr[,shout*, api,nobody?"])
        .stderr(Stdio::piped());
    let mut tail = Running::spawn(tail.stdout(Stdio::null()));
    let warnings = lines_of(tail.stderr.take().unwrap());
    // One warning per glob that matches nothing, naming the agents; `shout*` matches a
    // listener and `api` an injector, so neither is warned about.
    let first = line_matching(&warnings, |_| true);
    assert!(first.contains("no agent matches `gr[`"), "{first}");
    assert!(
        first.contains("greeter") && first.contains("shouter"),
        "{first}"
    );
    let second = line_matching(&warnings, |_| true);
    assert!(second.contains("no agent matches `nobody?`"), "{second}");
    // It keeps following the stream: still connected until the server stops.
    wait_until("tail still connected", || {
        metrics(&url).contains("agentserver_ws_clients{endpoint=\"/ws/messages\"} 1")
    });
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
    assert_eq!(wait_exit(&mut tail), Some(1), "the stream ended: exit 1");
    // Nothing more was said: `shout*` and `api` matched.
    assert!(warnings.try_iter().all(|l| !l.contains("no agent matches")));
}

/// `agentserver run` on the demo with `--store STORE`, expected to refuse at start: its exit
/// code and stderr.
fn run_demo_refused(store: &str) -> (Option<i32>, String) {
    let mut run = demo(store);
    run.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut run = Running::spawn(&mut run);
    let code = wait_exit(&mut run);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
    (code, stderr)
}

#[test]
fn a_second_server_on_the_same_store_file_or_an_empty_store_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("shared.db");
    let store = store.to_str().unwrap();
    let (mut first, url) = run_demo_on(store);
    let (code, stderr) = run_demo_refused(store);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("shared.db") && stderr.contains("in use by another agentserver"),
        "{stderr}"
    );
    // An empty --store is a usage error, not a temporary file.
    let (code, stderr) = run_demo_refused("");
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--store needs a file path"), "{stderr}");
    // The first runs on, and once it has stopped the file can be opened again.
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut first), Some(0));
    let (mut again, url) = run_demo_on(store);
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut again), Some(0));
}

#[test]
fn inject_and_tail_explain_an_unreachable_server_and_exit_1() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = agentserver()
        .args(["inject", "--url", &url, "--to", "x", "<X/>"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("cannot reach"), "{said}");
    assert!(
        said.to_lowercase().contains("connection refused"),
        "the cause: {said}"
    );
    let out = agentserver()
        .args(["tail", "--url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
    let out = agentserver()
        .args(["tail", "--url", "ftp://x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn sighup_reloads_the_organism_file() {
    let dir = tempfile::tempdir().unwrap();
    let xsd = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="Note" type="xs:string"/></xs:schema>"#;
    std::fs::write(dir.path().join("t.xsd"), xsd).unwrap();
    let one = "organism: { name: hup, store: memory }\nlisteners:\n  - {name: a, description: first, kind: native, handler: sink, schema: t.xsd}\n";
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, one).unwrap();
    let errors = dir.path().join("stderr.txt");
    let mut run = agentserver();
    run.args(["run", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    let (mut child, url) = child::serve(run, std::fs::File::create(&errors).unwrap().into());

    std::fs::write(
        &path,
        format!("{one}  - {{name: b, description: added, kind: native, handler: sink, schema: t.xsd}}\n"),
    )
    .unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let said = || std::fs::read_to_string(&errors).unwrap_or_default();
    wait_until("a reload on SIGHUP", || {
        said().contains("agentserver: reloaded (rev")
    });
    // The watch acts only after a change is stable for a second: SIGHUP is first.
    let text = said();
    assert!(text.contains("added [\"b\"]"), "{text}");
    let agents: serde_json::Value = block_on(async {
        http_get(format!("{url}/api/v1/agents"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let list = agents.get("items").unwrap_or(&agents);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut child), Some(0));
}

#[test]
fn a_port_alone_as_listen_means_loopback_on_that_port() {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/hello-world.yaml");
    let mut run = agentserver();
    run.args(["run", demo, "--listen", "0", "--store", "memory"]);
    let (mut server, url) = child::serve(run, Stdio::inherit());
    assert!(
        url.starts_with("http://127.0.0.1:") && !url.ends_with(":0"),
        "{url}"
    );
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
}

#[test]
fn inject_wait_prints_the_thread_and_exits_by_its_end() {
    let (mut server, url) = run_demo();
    let out = agentserver()
        .args([
            "inject",
            "--url",
            &url,
            "--to",
            "greeter",
            "--wait",
            "<Greeting><name>Wu</name></Greeting>",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert_eq!(lines[2]["payload"]["message"], "HELLO, WU!");
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
}

async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    agentserver::outbound::http_client()
        .unwrap()
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
}

/// The README's walk through `organisms/approvals.yaml`, as a user types it: a refund waits
/// at the payments gate, `inputs list` shows it, `inputs approve --payload` lets an edited
/// one through to the ledger; another is rejected; `abort` stops a third's thread.
#[test]
fn the_approvals_example_walks_through_the_inbox_from_the_command_line() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/approvals.yaml");
    let mut run = agentserver();
    run.args([
        "run",
        example,
        "--listen",
        "127.0.0.1:0",
        "--store",
        "memory",
    ]);
    let (mut server, url) = child::serve(run, Stdio::inherit());
    let cli = |args: &[&str]| -> (Option<i32>, String, String) {
        // `--url` goes with the command, before a subcommand (`inputs --url U list`).
        let out = agentserver()
            .arg(args[0])
            .args(["--url", &url])
            .args(&args[1..])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let inject = |amount: u32| -> String {
        let (code, out, err) = cli(&[
            "inject",
            "--to",
            "planner",
            &format!(r#"{{"customer": "acme-42", "amount": {amount}}}"#),
        ]);
        assert_eq!(code, Some(0), "{err}");
        let receipt: serde_json::Value = serde_json::from_str(&out).unwrap();
        receipt["thread_id"].as_str().unwrap().to_string()
    };
    let open_line = |thread: &str| -> String {
        let mut found = String::new();
        wait_until("the refund waits at the gate", || {
            let (_, out, _) = cli(&["inputs", "list", "--thread", thread]);
            found = out.lines().next().unwrap_or_default().to_string();
            found.contains("open")
        });
        found
    };
    let first = inject(120);
    let line = open_line(&first);
    assert!(
        line.contains("Refund 120 to acme-42") && line.contains("payments"),
        "{line}"
    );
    let id = line.split(' ').next().unwrap().to_string();
    let (code, out, err) = cli(&[
        "inputs",
        "approve",
        &id,
        "--payload",
        r#"{"customer": "acme-42", "amount": 100}"#,
        "--reason",
        "capped",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("approved") && out.contains("[edit by api]"),
        "{out}"
    );
    let (code, _, err) = cli(&["inputs", "reject", &id]);
    assert_eq!(code, Some(1), "a second decision is refused");
    assert!(err.contains("409 already_decided"), "{err}");

    let second = inject(5000);
    let id2 = open_line(&second).split(' ').next().unwrap().to_string();
    let (code, out, err) = cli(&["inputs", "reject", &id2, "--reason", "too much"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("declined"), "{out}");

    let third = inject(7);
    open_line(&third);
    let (code, out, err) = cli(&["abort", &third, "--reason", "duplicate"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), format!("thread {third} aborted"));
    let (_, out, _) = cli(&["inputs", "list", "--status", "all", "--thread", &third]);
    assert!(out.contains("cancelled"), "{out}");

    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
}
