//! `agentserver run` serving the API, and the `inject` and `tail` commands against it: real
//! processes, real sockets.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agentserver"))
}

/// Spawns a command and forwards its stdout lines to a channel.
fn spawn_lines(mut cmd: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn line_matching(rx: &mpsc::Receiver<String>, pred: impl Fn(&str) -> bool) -> String {
    loop {
        let line = rx.recv_timeout(WAIT).expect("the expected line in time");
        if pred(&line) {
            return line;
        }
    }
}

fn wait_exit(child: &mut Child) -> Option<i32> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(std::time::Instant::now() < deadline, "process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metrics(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(format!("{url}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
}

#[test]
fn run_serves_the_api_tail_follows_inject_posts_and_stop_exits_0() {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/hello-world.yaml");
    let mut run = bin();
    run.args(["run", demo, "--listen", "127.0.0.1:0", "--store", "memory"]);
    let (mut server, lines) = spawn_lines(run);
    let ready = line_matching(&lines, |l| l.starts_with("agentserver listening on "));
    let url = ready
        .trim_start_matches("agentserver listening on ")
        .to_string();
    assert!(!url.ends_with(":0"), "the real port is printed: {url}");

    let mut tail = bin();
    tail.args(["tail", "--url", &url, "--agent", "shout*"]);
    let (mut tail, tail_lines) = spawn_lines(tail);
    let deadline = std::time::Instant::now() + WAIT;
    while !metrics(&url).contains("agentserver_ws_clients{endpoint=\"/ws/messages\"} 1") {
        assert!(std::time::Instant::now() < deadline, "tail connects");
        std::thread::sleep(Duration::from_millis(20));
    }

    let out = bin()
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

    let first = line_matching(&tail_lines, |_| true);
    assert!(
        first.contains("greeter -> shouter GreetingResponse [pending]"),
        "{first}"
    );
    assert!(first.contains(&thread[thread.len() - 8..]), "{first}");
    let second = line_matching(&tail_lines, |_| true);
    assert!(
        second.contains("shouter -> response-handler Shouted"),
        "{second}"
    );
    assert!(second.contains("HELLO, ADA!"), "{second}");

    // JSON payloads map in schema order; a bad one is refused with the server's reason.
    let out = bin()
        .args([
            "inject",
            "--url",
            &url,
            "--to",
            "greeter",
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
    let out = bin()
        .args(["inject", "--url", &url, "--to", "greeter", "<Greeting/>"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("422") && stderr.contains("invalid_payload"),
        "{stderr}"
    );

    // Stop through the API: the server drains and exits 0; tail sees the stream end.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{url}/api/v1/organism/stop"))
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(status.as_u16(), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
    assert_eq!(wait_exit(&mut tail), Some(0));
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
    let out = bin()
        .args(["inject", "--url", &url, "--to", "x", "<X/>"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
    let out = bin().args(["tail", "--url", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
    let out = bin().args(["tail", "--url", "ftp://x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
}
