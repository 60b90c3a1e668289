//! `agentserver threads …` and `tail --label` against a running demo: fork with an edited
//! payload, rewind, pause and resume, a batch (a dry run, then the count it gave), and a
//! tail that shows only the labelled thread's messages; bad arguments exit 2.

use crate::child::{agentserver, wait_exit};
use crate::remote::{line_matching, run_demo, spawn_lines, stop};

/// Runs the CLI with `args` and `--url url`; its exit code and stdout.
fn cli(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    // The server's options follow the command (`threads --url … fork …`).
    let out = agentserver()
        .arg(args[0])
        .args(["--url", url])
        .args(&args[1..])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn threads_commands_fork_rewind_pause_and_batch_and_tail_follows_a_label() {
    let (mut server, url) = run_demo();
    // A tail of one customer's threads only.
    let mut tail = agentserver();
    tail.args(["tail", "--url", &url, "--label", "customer:acme-42"]);
    tail.stderr(std::process::Stdio::piped());
    let (mut tail, lines) = spawn_lines(tail);
    // Injected only once the tail says its labels hold: what came before is not shown.
    let said = crate::remote::lines_of(tail.stderr.take().unwrap());
    let ready = line_matching(&said, |l| l.starts_with("agentserver tail:"));
    assert_eq!(
        ready,
        "agentserver tail: following threads labelled customer:acme-42"
    );

    let greet = |name: &str, label: &str| {
        let payload = format!(r#"{{"name": "{name}"}}"#);
        let args = [
            "inject", "--to", "greeter", "--wait", "--label", label, &payload,
        ];
        let (code, out, err) = cli(&url, &args);
        assert_eq!(code, Some(0), "{err}");
        let first = json(out.lines().next().unwrap());
        first["thread_id"].as_str().unwrap().to_string()
    };
    let other = greet("Zed", "customer=other");
    let thread = greet("Ada", "customer=acme-42");
    let shown = line_matching(&lines, |l| l.contains("-> response-handler"));
    assert!(
        shown.contains(&thread) && shown.contains("HELLO, ADA!"),
        "{shown}"
    );
    assert!(!shown.contains(&other), "{shown}");

    // Fork at the second hop with an edited payload.
    let listed = crate::remote::messages_of(&url, &thread);
    let hop2 = listed[1]["id"].as_str().unwrap().to_string();
    let edit = "<GreetingResponse><message>Hello, Eve!</message></GreetingResponse>";
    let (code, out, err) = cli(
        &url,
        &[
            "threads",
            "fork",
            &thread,
            "--at",
            &hop2,
            "--payload",
            edit,
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let fork = json(&out)["thread_id"].as_str().unwrap().to_string();
    // The fork inherits the label: the tail shows its run too.
    let forked = line_matching(&lines, |l| {
        l.contains(&fork) && l.contains("-> response-handler")
    });
    assert!(forked.contains("HELLO, EVE!"), "{forked}");

    // Rewind the original to its second hop: a line for people.
    let (code, out, err) = cli(&url, &["threads", "rewind", &thread, "--to", &hop2]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("1 superseded") && out.contains("shouter runs again"),
        "{out}"
    );

    let (code, out, _) = cli(&url, &["threads", "pause", &other]);
    assert_eq!(
        (code, out.trim().ends_with("(paused)")),
        (Some(0), true),
        "{out}"
    );
    let (code, out, _) = cli(&url, &["threads", "resume", &other]);
    assert_eq!((code, out.contains("(paused)")), (Some(0), false), "{out}");

    // A batch: refused without a count; a dry run says it; then with it.
    let batch = ["threads", "batch", "pause", "--label", "customer:acme-42"];
    let (code, _, err) = cli(&url, &batch);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--dry-run"), "{err}");
    let (code, out, _) = cli(&url, &[&batch[..], &["--dry-run"]].concat());
    assert_eq!(code, Some(0));
    assert!(
        out.contains("matched 2, applied 2") && out.contains("dry run"),
        "{out}"
    );
    let (code, out, err) = cli(&url, &[&batch[..], &["--expected", "3"]].concat());
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.contains("409") && err.contains("count_mismatch"),
        "{err}"
    );
    let (code, out, _) = cli(&url, &[&batch[..], &["--expected", "2"]].concat());
    assert_eq!(
        (code, out.trim()),
        (Some(0), "matched 2, applied 2, skipped 0")
    );

    let (code, _, err) = cli(
        &url,
        &["threads", "fork", &thread, "--at", &hop2, "--label", "nope"],
    );
    assert_eq!(code, Some(2), "{err}");

    // A label test the server refuses ends a tail with the server's words, in either mode.
    for json in [false, true] {
        let args = if json {
            vec!["tail", "--label", "oops", "--json"]
        } else {
            vec!["tail", "--label", "oops"]
        };
        let (code, out, err) = cli(&url, &args);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("400") && err.contains("a label test is `key:value`"),
            "{err}"
        );
        assert_eq!(out.contains("\"event\":\"error\""), json, "{out}");
    }
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
    drop(tail);
}

/// The `external_echo` example's binary, built if this run has not (`--all-targets` has).
fn external_echo() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples");
    let bin = dir.join("external_echo");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = std::process::Command::new(cargo)
            .args(["build", "--example", "external_echo"])
            .status()
            .unwrap();
        assert!(built.success());
    }
    bin
}

/// A fork at the message to a real external agent (`examples/external_echo.rs`, its own
/// process) forwards it again with the fork's thread id, and the agent's reply by callback
/// lands in the fork, not in the thread forked.
#[test]
fn a_fork_reforwards_to_a_real_external_agent_with_the_forks_thread_id() {
    use std::io::BufRead;
    let mut echo = std::process::Command::new(external_echo());
    echo.args(["127.0.0.1:0"])
        .env("ECHO_TOKEN", "fork-test")
        .stdout(std::process::Stdio::piped());
    let mut echo = crate::child::Running::spawn(&mut echo);
    let mut out = std::io::BufReader::new(echo.stdout.take().unwrap()).lines();
    let first = out.next().unwrap().unwrap();
    let input = first.rsplit(' ').next().unwrap().to_string();
    assert!(input.ends_with("/input"), "{first}");
    std::thread::spawn(move || for _ in out {});

    let dir = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/organisms/external-echo.yaml"
    ))
    .unwrap()
    .replace("http://127.0.0.1:8769/input", &input);
    let path = dir.path().join("echo.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut run = agentserver();
    run.args([
        "run",
        path.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--store",
        "memory",
    ])
    .env("ECHO_TOKEN", "fork-test");
    let (mut server, url) = crate::child::serve(run, std::process::Stdio::inherit());

    let args = [
        "inject",
        "--to",
        "echo-agent",
        "--wait",
        r#"{"text": "first"}"#,
    ];
    let (code, out, err) = cli(&url, &args);
    assert_eq!(code, Some(0), "{err}");
    let thread = json(out.lines().next().unwrap())["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    let asked = crate::remote::messages_of(&url, &thread);
    let question = asked.iter().find(|m| m["to"] == "echo-agent").unwrap();
    let qid = question["id"].as_str().unwrap();

    let edit = "<Question><text>second</text></Question>";
    let (code, out, err) = cli(
        &url,
        &[
            "threads",
            "fork",
            &thread,
            "--at",
            qid,
            "--payload",
            edit,
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let fork = json(&out)["thread_id"].as_str().unwrap().to_string();
    crate::child::wait_until("the agent's reply in the fork", || {
        crate::remote::messages_of(&url, &fork).iter().any(|m| {
            m["to"] == "logbook"
                && m["payload_xml"]
                    .as_str()
                    .unwrap_or("")
                    .contains("you asked: second")
        })
    });
    // The thread forked got no second answer.
    let original = crate::remote::messages_of(&url, &thread);
    assert_eq!(original.len(), asked.len());
    assert!(original
        .iter()
        .all(|m| !m["payload_xml"].as_str().unwrap_or("").contains("second")));
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
    drop(echo);
}
