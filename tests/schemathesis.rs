//! schemathesis (PyPI), an outside tool, against the live OpenAPI document of a real server
//! with keys (organisms/tenants.yaml): as an admin and with no credential, every check, its
//! examples bounded and its seed fixed; any finding fails the test. `scripts/test` installs
//! it. By hand: `st run http://127.0.0.1:8771/api/v1/openapi.json -H "Authorization: Bearer
//! $(cat admin.key)" --checks all`.
//!
//! Left out, each for its reason: the organism's stop and pause (they end the run), `/ws` and
//! `/ws/messages` (an HTTP upgrade, which the document cannot make a client perform), revoking
//! keys (it would revoke the admin's key mid-run); and from `positive_data_acceptance` only,
//! `POST /agents` and `POST /keys`, whose bodies carry rules a schema cannot state (a Lua
//! script that compiles; `fields` or `xsd`; a burst only with a rate).

mod common;

use agentserver::access::{KeySource, Role};
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::Organism;

fn schemathesis(url: &str, args: &[&str]) -> (bool, String) {
    // Its command-line entry point through python3, whichever directory pip put `st` in.
    let mut cmd = std::process::Command::new("python3");
    cmd.args([
        "-c",
        "import sys; from schemathesis.cli import schemathesis; sys.argv[0] = 'st'; schemathesis()",
        "run",
        url,
        "--max-examples",
        "10",
        "--seed",
        "1",
        "--no-color",
    ])
    .args([
        "--exclude-path",
        "/api/v1/organism/stop",
        "--exclude-path",
        "/api/v1/organism/pause",
        "--exclude-path",
        "/ws",
        "--exclude-path",
        "/ws/messages",
        // An event stream does not end (tests/api/stream.rs reads it).
        "--exclude-path",
        "/api/v1/threads/{id}/events",
        "--exclude-path",
        "/api/v1/keys/{name}",
    ])
    .args(args);
    let out = cmd
        .output()
        .expect("python3 runs (scripts/test installs schemathesis with pip)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_as_an_admin_or_without_a_credential() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/organisms/tenants.yaml"
    ))
    .unwrap()
    // It sends many wrong credentials on purpose: not a brute force to slow down.
    .replace(
        "  methods: [keys]",
        "  methods: [keys]\n  failed_auth_per_minute: 1000000",
    );
    let path = dir.path().join("tenants.yaml");
    std::fs::write(&path, yaml).unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let (key, row) = agentserver::access::new_key("admin", Role::Admin, None, None).unwrap();
    KeySource::of(&config).unwrap().add(&row).unwrap();
    let organism = Organism::builder().build(config).unwrap();
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let url = format!("http://{}/api/v1/openapi.json", server.local_addr());
    let bearer = format!("Authorization: Bearer {key}");
    let runs: [(&str, Vec<&str>); 3] = [
        (
            "as an admin",
            vec![
                "-H",
                &bearer,
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
            ],
        ),
        (
            "as an admin, schema-valid data accepted",
            vec![
                "-H",
                &bearer,
                "--checks",
                "positive_data_acceptance",
                "--exclude-path",
                "/api/v1/agents",
                "--exclude-path",
                "/api/v1/keys",
            ],
        ),
        (
            "without a credential",
            vec![
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
            ],
        ),
    ];
    for (what, args) in runs {
        let url = url.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (ok, said) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            schemathesis(&url, &args)
        })
        .await
        .unwrap();
        assert!(ok, "schemathesis {what}:\n{said}");
    }
    organism.stop().await;
    server.shutdown().await;
}
