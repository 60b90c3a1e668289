//! `agentserver send`: the demo's three-hop transcript, and failures exit 1.

use std::process::Command;

mod child;

fn send(payload: &str) -> std::process::Output {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/hello-world.yaml");
    child::run_to_exit(["send", demo, "--to", "greeter", payload])
}

#[test]
fn send_prints_the_three_hop_transcript_and_exits_0() {
    let out = send("<Greeting><name>Dan</name></Greeting>");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let hops: Vec<(&str, &str)> = lines
        .iter()
        .map(|m| (m["from"].as_str().unwrap(), m["to"].as_str().unwrap()))
        .collect();
    assert_eq!(
        hops,
        vec![
            ("cli", "greeter"),
            ("greeter", "shouter"),
            ("shouter", "response-handler")
        ]
    );
    assert_eq!(lines[2]["payload"]["message"], "HELLO, DAN!");
    assert!(lines.iter().all(|m| m["status"] == "delivered"));
    assert_eq!(lines[1]["parent_id"], lines[0]["id"]);
}

#[test]
fn send_with_an_invalid_payload_explains_and_exits_1() {
    let out = send("<Greeting><name></name></Greeting>");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("inject refused: payload is invalid: line 1:"),
        "{stderr}"
    );
}

#[test]
fn run_stops_gracefully_on_sigterm_and_exits_0() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/hello-world.yaml");
    let mut child = child::Running::spawn(
        child::agentserver()
            .args(["run", demo, "--listen", "127.0.0.1:0", "--store", "memory"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // Wait for the ready lines (blocking reads: the process prints them once it serves).
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("running organism hello-world"), "{line}");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("agentserver listening on http://127.0.0.1:"),
        "{line}"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn the_lua_playground_replies_and_reports_a_big_total() {
    let playground = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/lua-playground.yaml");
    let out = child::run_to_exit([
        "send",
        playground,
        "--to",
        "calculator",
        "<Sum><numbers>99</numbers><numbers>2</numbers><label>rent</label></Sum>",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["to"], "cli");
    assert_eq!(
        lines[1]["payload_xml"],
        "<Total><label>rent</label><total>101</total></Total>"
    );
    assert_eq!(lines[2]["to"], "auditor");
    assert_eq!(lines[2]["payload"]["total"], 101);
}

#[test]
fn send_with_a_payload_file_that_is_not_utf8_explains_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.xml");
    std::fs::write(&file, [0x3c, 0xff, 0xfe, 0x3e]).unwrap();
    let out = send(&format!("@{}", file.display()));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not UTF-8 text"), "{stderr}");
}

/// The default store is beside the organism file, whatever directory `run` starts from, and
/// `run` says where it is.
#[test]
fn the_default_store_is_beside_the_organism_file_and_run_names_it() {
    use std::io::{BufRead, BufReader};
    let files = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(
        files.path().join("o.yaml"),
        "organism: {name: beside}\nlisteners:\n  - {name: s, description: keeps, kind: native, handler: sink, fields: {Note: {text: string}}}\n",
    )
    .unwrap();
    let yaml = files.path().join("o.yaml");
    let mut cmd = child::agentserver();
    cmd.current_dir(elsewhere.path()).args([
        "run",
        yaml.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    let (mut running, _url) = child::serve(cmd, std::process::Stdio::piped());
    let stderr = running.stderr.take().unwrap();
    let mut said = String::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.starts_with("agentserver: store ") {
            said = line;
            break;
        }
    }
    let expected = files.path().join("data").join("beside.db");
    assert_eq!(said, format!("agentserver: store {}", expected.display()));
    assert!(expected.exists(), "{}", expected.display());
    assert!(!elsewhere.path().join("data").exists());
}

/// `send` takes a JSON payload as `inject` does, written as the listener's type; a JSON
/// payload that does not fit says where.
#[test]
fn send_takes_json_as_inject_does() {
    let out = send(r#"{"name": "Ada"}"#);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("HELLO, ADA!"));
    let out = send(r#"{"nme": "Ada"}"#);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("payload.nme") && said.contains("expected one of: name"),
        "{said}"
    );
}

/// A hot reload that the file refuses is logged with the file and the line.
#[test]
fn a_refused_hot_reload_is_logged_with_its_file_and_line() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("o.yaml");
    let good = "organism: {name: hot, store: memory}\nlisteners:\n  - name: s\n    description: keeps\n    kind: native\n    handler: sink\n    fields: {Note: {text: string}}\n";
    std::fs::write(&yaml, good).unwrap();
    let mut cmd = child::agentserver();
    cmd.args(["run", yaml.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    let (mut running, _url) = child::serve(cmd, std::process::Stdio::piped());
    let stderr = running.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::fs::write(&yaml, format!("{good}    concurrency: two\n")).unwrap();
    let deadline = std::time::Instant::now() + child::WAIT;
    let line = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("a log line about the reload in time");
        if line.contains("organism reload failed") {
            break line;
        }
    };
    assert!(
        line.contains(yaml.to_str().unwrap())
            && line.contains("line 8: listener `s`: key `concurrency`: is the text \"two\""),
        "{line}"
    );
}
