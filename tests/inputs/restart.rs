//! Held messages and questions survive the process ending however it ends: the real binary,
//! a real store file, `kill -9` with 100 messages held and 10 questions open, then every input
//! still open, the threads `waiting`, and an approval and an answer after the restart route.

use serde_json::{json, Value};

use super::common::child::{agentserver, serve, Running};
use super::common::{wait_until_async, TEST_XSD};

const HELD: usize = 100;
const QUESTIONS: usize = 10;

fn organism(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let yaml = format!(
        "organism:\n  name: gated\n  store: {}\nlisteners:\n\
  - {{name: pay, description: payments, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {{to: c}}, approval: {{timeout: 7d}}}}\n\
  - {{name: c, description: ledger, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}}\n\
  - {{name: reviewer, description: a person, kind: human, schema: t.xsd, accepts: [Ping], peers: [c]}}\n",
        dir.join("log.db").display()
    );
    let path = dir.join("organism.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

#[test]
fn held_messages_survive_kill_9_and_an_approval_then_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let path = organism(dir.path());
    let start = || -> (Running, String) {
        let mut cmd = agentserver();
        cmd.args(["run", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
        serve(cmd, std::process::Stdio::null())
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = rt.block_on(async { super::common::http() });
    let get = |url: String| -> Value {
        rt.block_on(async { http.get(url).send().await.unwrap().json().await.unwrap() })
    };

    let (mut child, url) = start();
    // Injects `xml` to `to`; the thread it opened.
    let inject = |to: &str, xml: String| -> String {
        let body = json!({"to": to, "payload_xml": xml});
        let r: Value = rt.block_on(async {
            let sent = http.post(format!("{url}/api/v1/inject")).json(&body).send();
            sent.await.unwrap().json().await.unwrap()
        });
        r["thread_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    };
    let threads: Vec<String> = (0..HELD)
        .map(|i| inject("pay", format!("<Note>n{i}</Note>")))
        .collect();
    for i in 0..QUESTIONS {
        inject("reviewer", format!("<Ping><n>{i}</n></Ping>"));
    }
    let open = get(format!("{url}/api/v1/inputs?status=open&limit=0"));
    assert_eq!(open["total"], HELD + QUESTIONS, "{open}");

    child.kill().unwrap(); // SIGKILL: no stop at all.
    child.wait().unwrap();
    let (child, url) = start();

    let open = get(format!("{url}/api/v1/inputs?status=open&limit=1000"));
    assert_eq!(open["total"], HELD + QUESTIONS, "every input is open again");
    let questions = get(format!("{url}/api/v1/inputs?status=open&kind=question"));
    assert_eq!(questions["total"], QUESTIONS, "{questions}");
    let q = &questions["items"][0];
    let qt = get(format!(
        "{url}/api/v1/threads/{}",
        q["thread_id"].as_str().unwrap()
    ));
    assert_eq!(qt["status"], "waiting", "{qt}");
    rt.block_on(async {
        let r = http
            .post(format!(
                "{url}/api/v1/inputs/{}/answer",
                q["id"].as_str().unwrap()
            ))
            .json(&json!({"payload": "answered after a restart", "to": "c"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    });
    let t = get(format!("{url}/api/v1/threads/{}", threads[0]));
    assert_eq!(t["status"], "waiting", "{t}");
    assert_eq!(t["messages"][0]["status"], "held", "{t}");

    let input = open["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["thread_id"] == threads[0].as_str())
        .expect("the first thread's input")
        .clone();
    rt.block_on(async {
        let r = http
            .post(format!(
                "{url}/api/v1/inputs/{}/approve",
                input["id"].as_str().unwrap()
            ))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        let thread = &threads[0];
        wait_until_async("the approved message reaches c", || async {
            let t: Value = http
                .get(format!("{url}/api/v1/threads/{thread}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            t["status"] == "completed"
                && t["messages"].as_array().is_some_and(|m| {
                    m.iter()
                        .any(|m| m["to"] == "c" && m["status"] == "delivered")
                })
        })
        .await;
    });
    let open = get(format!("{url}/api/v1/inputs?status=open&limit=0"));
    assert_eq!(open["total"], HELD + QUESTIONS - 2);
    drop(child);
}
