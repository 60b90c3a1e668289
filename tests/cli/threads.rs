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
    let (tail, lines) = spawn_lines(tail);

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
    assert_eq!(stop(&url), 202);
    assert_eq!(wait_exit(&mut server), Some(0));
    drop(tail);
}
