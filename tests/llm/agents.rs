//! `kind: llm` agents created through the API by a tenant: its models only, at most its
//! count; the system prompt versioned, tried (test vectors against the configured model, or
//! a scripted one) and deployed like a script; the other tenant sees none of it.

use agentserver::config::Role;

use super::*;

struct Api {
    base: String,
    keys: std::collections::HashMap<&'static str, String>,
}

impl Api {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = http()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.keys[key]);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, key: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, key, Some(body))
            .await
    }
}

/// An LLM agent of acme's: `name`, on `model`, sending `Plan` to `acme-worker`.
fn agent(name: &str, model: &str, system: &str) -> Value {
    json!({
        "name": name, "description": "plans", "kind": "llm", "model": model,
        "system": system, "xsd": XSD, "accepts": ["Task"], "outputs": ["Plan"],
        "peers": ["acme-worker"], "limits": {"max_rounds": 2},
    })
}

fn plan_case() -> Value {
    json!([{"payload": {"goal": "x"},
            "expect": {"status": "completed", "outputs": [{"to": "acme-worker", "type": "Plan"}]}}])
}

#[tokio::test]
async fn a_tenant_creates_tries_and_deploys_an_llm_agent_on_its_own_models() {
    let fake = Fake::default();
    let url = fake.serve().await;
    for _ in 0..4 {
        fake.then(call(
            "send_acme-worker__Plan",
            json!({"step": ["a"], "priority": 1}),
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!(
            "organism: {{name: llm-agents, store: agents.db}}
auth: {{methods: [keys]}}
tenants:
  acme: {{models: [m, s], max_llm_agents: 2}}
models:
  m: {{base_url: '{url}', model: test-model, timeout_ms: 2000}}
  big: {{base_url: '{url}', model: big-model}}
  s:
    provider: scripted
    responses:
      - {{tool: send_acme-worker__Plan, arguments: {{step: [draft], priority: 2}}}}
listeners:
  - {{name: acme-worker, description: works, kind: native, handler: sink, schema: p.xsd, accepts: [Plan], tenant: acme}}
  - {{name: globex-worker, description: works, kind: native, handler: sink, schema: p.xsd, accepts: [Plan], tenant: globex}}
"
        ),
    )
    .unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let keys = keys_for(
        &config,
        &[
            ("acme-op", Role::Operator, Some("acme")),
            ("globex-op", Role::Operator, Some("globex")),
        ],
    );
    let o = Organism::builder().build(config).unwrap();
    let server = serve(&o).await;
    let api = Api {
        base: format!("http://{}", server.local_addr()),
        keys,
    };

    // Wrong texts and models are refused, saying where.
    let mut with_script = agent("acme-planner", "m", "p");
    with_script["script"] = json!("function handle() end");
    let (code, body) = api.post("/api/v1/agents", "acme-op", with_script).await;
    assert_eq!(
        (code, &body["error"]["where"]),
        (400, &json!("script")),
        "{body}"
    );
    let (code, body) = api
        .post("/api/v1/agents", "acme-op", agent("acme-big", "big", "p"))
        .await;
    assert_eq!(code, 422, "{body}");
    assert!(body.to_string().contains("tenants.acme.models"), "{body}");

    // On the scripted model, its test vectors pass; live, its tool call reaches the peer.
    let mut scripted = agent("acme-scripted", "s", "You plan.");
    scripted["cases"] = plan_case();
    let (code, body) = api.post("/api/v1/agents", "acme-op", scripted).await;
    assert_eq!(code, 201, "{body}");
    let (code, report) = api
        .post(
            "/api/v1/agents/acme-scripted/scripts/1/test",
            "acme-op",
            json!({"cases": plan_case()}),
        )
        .await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["passed"], 1, "{report}");

    // On a model server: each version's prompt is the one the server reads.
    let (code, body) = api
        .post(
            "/api/v1/agents",
            "acme-op",
            agent("acme-planner", "m", "You plan v1."),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = api
        .post("/api/v1/agents", "acme-op", agent("acme-third", "m", "p"))
        .await;
    assert_eq!(code, 422, "{body}");
    assert!(body.to_string().contains("max_llm_agents"), "{body}");
    let (code, body) = api
        .post(
            "/api/v1/inject",
            "acme-op",
            json!({"to": "acme-planner", "payload": {"goal": "ship"}}),
        )
        .await;
    assert_eq!(code, 202, "{body}");
    let t = body["thread_id"].as_str().unwrap().to_string();
    settle(&o, &t).await;
    assert!(messages(&o, &t)
        .iter()
        .any(|m| to_of(m) == "acme-worker" && m.status == MessageStatus::Delivered));
    let system = |i: usize| fake.requests()[i]["messages"][0]["content"].clone();
    assert_eq!(system(0), "You plan v1.");

    let v2 = json!({"system": "You plan v2.", "cases": plan_case()});
    let (code, dry) = api
        .post(
            "/api/v1/agents/acme-planner/scripts?dry_run=true",
            "acme-op",
            v2.clone(),
        )
        .await;
    assert_eq!(code, 200, "{dry}");
    assert_eq!(dry["tests"]["passed"], 1, "{dry}");
    assert_eq!(system(1), "You plan v2.");
    let (code, body) = api
        .post(
            "/api/v1/agents/acme-planner/scripts",
            "acme-op",
            json!({"script": "function handle() end"}),
        )
        .await;
    assert_eq!(
        (code, &body["error"]["where"]),
        (400, &json!("script")),
        "{body}"
    );
    let (code, body) = api
        .post("/api/v1/agents/acme-planner/scripts", "acme-op", v2)
        .await;
    assert_eq!((code, &body["version"]), (201, &json!(2)), "{body}");
    let (code, body) = api
        .post(
            "/api/v1/agents/acme-planner/deployments",
            "acme-op",
            json!({"version": 2}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let (code, source) = api
        .send(
            reqwest::Method::GET,
            "/api/v1/agents/acme-planner/scripts/2",
            "acme-op",
            None,
        )
        .await;
    assert_eq!((code, &source["script"]), (200, &json!("You plan v2.")));
    let (_, body) = api
        .post(
            "/api/v1/inject",
            "acme-op",
            json!({"to": "acme-planner", "payload": {"goal": "again"}}),
        )
        .await;
    settle(&o, body["thread_id"].as_str().unwrap()).await;
    let last = fake.requests().len() - 1;
    assert_eq!(system(last), "You plan v2.");

    // From the command line, a prompt file is pushed as a version.
    std::fs::write(dir.path().join("v3.md"), "You plan v3.").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentserver"))
        .args([
            "scripts",
            "--url",
            &api.base,
            "--token",
            &api.keys["acme-op"],
        ])
        .args(["push", "acme-planner"])
        .arg(dir.path().join("v3.md"))
        .arg("--prompt")
        .env_remove("AGENTSERVER_TOKEN")
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("v3 kept"),
        "{said} {out:?}"
    );

    // The other tenant sees none of it.
    for path in [
        "/api/v1/agents/acme-planner",
        "/api/v1/agents/acme-planner/scripts",
        "/api/v1/agents/acme-planner/scripts/2",
    ] {
        let (code, body) = api
            .send(reqwest::Method::GET, path, "globex-op", None)
            .await;
        assert_eq!(code, 404, "{path}: {body}");
    }
    let (code, _) = api
        .post(
            "/api/v1/agents/acme-planner/scripts",
            "globex-op",
            json!({"system": "You work for globex now."}),
        )
        .await;
    assert_eq!(code, 404);
    let (code, _) = api
        .post(
            "/api/v1/inject",
            "globex-op",
            json!({"to": "acme-planner", "payload": {"goal": "x"}}),
        )
        .await;
    assert_eq!(code, 404);
    o.stop().await;
}
