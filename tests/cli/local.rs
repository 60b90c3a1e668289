//! `agentserver send`: the demo's three-hop transcript, and failures exit 1.

use std::process::Command;

use crate::child;

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
fn the_llm_demo_runs_offline_on_its_scripted_model() {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/llm-demo.yaml");
    let out = child::run_to_exit([
        "send",
        demo,
        "--to",
        "planner",
        "<Task><goal>launch</goal></Task>",
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
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        (lines[1]["from"].as_str(), lines[1]["to"].as_str()),
        (Some("planner"), Some("worker"))
    );
    assert_eq!(
        lines[1]["payload"],
        serde_json::json!({"step": ["draft", "review", "ship"], "priority": 2})
    );
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

/// README's walk-through blocks ("Security", "For tenants"), run as written by bash against
/// a copy of `organisms/tenants.yaml` (on a free port instead of 8771), with this build's
/// `agentserver` first on the PATH: every command succeeds, and the agent the tenant
/// created, upgraded and rolled back answers as the README says.
#[test]
fn the_readmes_tenant_walk_through_runs_as_written() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut rest = readme.as_str();
    while let Some(at) = rest.find("<!-- walk-through: tenants") {
        rest = &rest[at..];
        let open = rest.find("```").unwrap();
        let body = &rest[open..];
        let start = body.find('\n').unwrap() + 1;
        let end = body[start..].find("\n```").unwrap();
        blocks.push(body[start..start + end].to_string());
        rest = &body[start + end..];
    }
    assert_eq!(blocks.len(), 2, "the two walk-through blocks");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("organisms")).unwrap();
    let yaml = std::fs::read_to_string(root.join("organisms/tenants.yaml")).unwrap();
    std::fs::write(
        dir.path().join("organisms/tenants.yaml"),
        yaml.replace("8771", &port),
    )
    .unwrap();
    let script = format!(
        "set -euo pipefail\n{}\nsleep 0.5\nkill $(jobs -p)\nwait || true\n",
        blocks.join("\n").replace("8771", &port)
    );
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_agentserver"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Its own process group, killed whole at the end: a server it left running in the
    // background (a failed step) goes too. Output to files, which a background process
    // holding them open cannot make this wait on.
    use std::os::unix::process::CommandExt;
    let (out_file, err_file) = (dir.path().join("out.txt"), dir.path().join("err.txt"));
    let mut script_run = std::process::Command::new("timeout")
        .args(["60", "bash", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let status = script_run.wait().unwrap();
    // SAFETY: kill(2) of the process group this test made.
    unsafe { libc::kill(-(script_run.id() as i32), libc::SIGKILL) };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("\"thread_id\""), "the inject: {stdout}");
    assert!(
        stdout.contains("\"agent\":\"acme-echo\",\"version\":1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\"payload\":{\"text\":\"HI\",\"version\":2}"),
        "version 2 answered: {stdout}"
    );
    assert!(stdout.contains("revoked wall"), "{stdout}");
}
