//! Usage and budgets: each call accounted as reported or estimated, kept past pruning and
//! restart; a tenant's day and a thread's budget refusing a call before it is made; a
//! tenant's LLM listeners held to its models and count.

use super::*;
#[tokio::test]
async fn each_call_is_accounted_as_reported_or_estimated_and_pruning_changes_nothing() {
    let fake = Fake::default();
    let url = fake.serve().await;
    // Reported usage (10 in, 5 out), then an answer without any.
    fake.then(call(
        "send_worker__Plan",
        json!({"step": ["a"], "priority": 1}),
    ))
    .then(text("no usage here"));
    let (o, d) = organism_stored(&url, "", "data.db");
    let server = serve(&o).await;
    let base = format!("http://{}", server.local_addr());
    let mut ws = ws_connect(&format!("ws://{}/ws", server.local_addr())).await;
    next_json(&mut ws).await;
    ask(&o).await;
    ask(&o).await;
    let seen = read_until(&mut ws, |f| f["event"] == "usage" && f["estimated"] == true).await;
    let first = seen.iter().find(|f| f["event"] == "usage").unwrap();
    assert_eq!(
        (
            &first["listener"],
            &first["model"],
            &first["input_tokens"],
            &first["output_tokens"]
        ),
        (&json!("planner"), &json!("m"), &json!(10), &json!(5))
    );
    let usage = |q: &str| {
        let url = format!("{base}/api/v1/usage{q}");
        async move { http_get(url).await.unwrap().json::<Value>().await.unwrap() }
    };
    let by = usage("?group_by=listener,model").await;
    let row = &by["items"][0];
    assert_eq!(by["items"].as_array().unwrap().len(), 1, "{by}");
    assert_eq!(
        (&row["listener"], &row["model"], &row["calls"]),
        (&json!("planner"), &json!("m"), &json!(2))
    );
    assert_eq!(row["estimated_calls"], 1);
    let input = row["input_tokens"].as_u64().unwrap();
    assert!(input > 10, "the estimated call adds its prompt: {input}");
    let r = http_get(format!("{base}/api/v1/usage?group_by=week"))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http_get(format!("{base}/api/v1/usage?from=yesterday"))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // After a restart and a retention that prunes every message, the account is the same.
    let store = stopped(server, o, &d.path().join("data.db")).await;
    store.prune(Some(0), None).unwrap();
    let q = agentserver::store::usage::UsageQuery::default();
    let all = store.usage(&q).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].calls, all[0].input_tokens), (2, input));
}

#[tokio::test]
async fn a_tenants_day_budget_refuses_a_call_before_it_is_made_and_then_injects() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(Next::Hang).then(Next::Json(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 200}
    })));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let yaml = format!(
        "organism: {{name: llm, store: data.db}}
tenants:
  acme: {{tokens_per_day: 1000}}
models:
  m: {{base_url: '{url}', model: test-model, timeout_ms: 500}}
listeners:
  - {{name: planner, description: plans, kind: llm, model: m, system: s, schema: p.xsd, accepts: [Task], tenant: acme, concurrency: 2, limits: {{max_tokens: 600}}}}
"
    );
    std::fs::write(dir.path().join("o.yaml"), yaml).unwrap();
    let o = Organism::builder()
        .load(&dir.path().join("o.yaml"))
        .unwrap();
    // Two at once: the first holds about 600 + its prompt of the 1,000; the second cannot.
    let a = inject(&o, "planner", "<Task><goal>a</goal></Task>", None);
    let b = inject(&o, "planner", "<Task><goal>b</goal></Task>", None);
    settle(&o, &a.thread_id).await;
    settle(&o, &b.thread_id).await;
    let errors: Vec<String> = [&a, &b]
        .iter()
        .map(|r| {
            messages(&o, &r.thread_id)[0]
                .error
                .clone()
                .unwrap_or_default()
        })
        .collect();
    let refused: Vec<&String> = errors.iter().filter(|e| e.contains("budget:")).collect();
    assert_eq!(refused.len(), 1, "{errors:?}");
    assert!(
        refused[0].contains("tenants.acme.tokens_per_day (1000 tokens) reached; resets 20"),
        "{}",
        refused[0]
    );
    assert_eq!(
        fake.requests().len(),
        1,
        "the refused call never reached the server"
    );

    // A call that takes 1,100 tokens uses the day up: injects wait, saying until when.
    let c = inject(&o, "planner", "<Task><goal>c</goal></Task>", None);
    settle(&o, &c.thread_id).await;
    let server = serve(&o).await;
    let r = http()
        .post(format!("http://{}/api/v1/inject", server.local_addr()))
        .json(&json!({"to": "planner", "payload_xml": "<Task><goal>d</goal></Task>"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&wait), "{wait}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "budget_exhausted");
    assert_eq!(body["error"]["where"], "tenants.acme.tokens_per_day");
    let b: Value = http_get(format!(
        "http://{}/api/v1/usage/budgets",
        server.local_addr()
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let day = &b["items"][0];
    assert_eq!(
        (
            &day["tenant"],
            &day["key"],
            &day["limit"],
            &day["remaining"]
        ),
        (
            &json!("acme"),
            &json!("tokens_per_day"),
            &json!(1000),
            &json!(0)
        ),
        "{b}"
    );
    assert!(day["used"].as_u64().unwrap() >= 1100);
    let metrics = http_get(format!("http://{}/metrics", server.local_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "agentserver_budget_remaining{tenant=\"acme\",window=\"tokens_per_day\"} 0\n"
        ),
        "{metrics}"
    );

    // After a restart the day is still used up: its use is read from the usage account.
    server.shutdown().await;
    o.stop().await;
    drop(o);
    let mut again = None;
    wait_until_async("the store is let go", || {
        again = Organism::builder().load(&dir.path().join("o.yaml")).ok();
        std::future::ready(again.is_some())
    })
    .await;
    let o = again.unwrap();
    let refused = o.inject(agentserver::InjectRequest {
        from: "api".into(),
        to: "planner".into(),
        payload_xml: "<Task><goal>e</goal></Task>".into(),
        thread_id: None,
    });
    assert!(
        matches!(refused, Err(agentserver::InjectError::BudgetExhausted(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_threads_budget_refuses_the_call_that_would_pass_it_in_that_thread_only() {
    let fake = Fake::default();
    let url = fake.serve().await;
    let answer = || {
        Next::Json(json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 300, "completion_tokens": 50}
        }))
    };
    fake.then(answer()).then(answer());
    let (o, _d) = organism(
        &url,
        "    limits: {max_tokens: 600}\n    budget: {tokens_per_thread: 700}",
    );
    let first = inject(&o, "planner", "<Task><goal>a</goal></Task>", None);
    settle(&o, &first.thread_id).await;
    let again = inject(
        &o,
        "planner",
        "<Task><goal>b</goal></Task>",
        Some(&first.thread_id),
    );
    settle(&o, &again.thread_id).await;
    let ms = messages(&o, &first.thread_id);
    let second = ms.iter().find(|m| m.id == again.message_id).unwrap();
    assert_eq!(second.status, MessageStatus::Failed);
    let e = second.error.as_deref().unwrap();
    assert!(
        e.contains(
            "`planner`'s budget.tokens_per_thread (700 tokens) reached in this thread (350 used)"
        ),
        "{e}"
    );
    assert_eq!(
        fake.requests().len(),
        1,
        "the refused call never reached the server"
    );
    // Another thread has a budget of its own.
    ask(&o).await;
    assert_eq!(fake.requests().len(), 2);
}

#[test]
fn a_tenants_llm_listeners_use_its_models_and_are_at_most_its_count() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let yaml = "organism: {name: llm, store: memory}
tenants:
  acme: {models: [small], max_llm_agents: 1}
  beta: {models: [nope]}
models:
  small: {provider: scripted, responses: [{text: hi}]}
  large: {provider: scripted, responses: [{text: hi}]}
listeners:
  - {name: a1, description: d, kind: llm, model: small, system: s, schema: p.xsd, accepts: [Task], tenant: acme}
  - {name: a2, description: d, kind: llm, model: large, system: s, schema: p.xsd, accepts: [Task], tenant: acme}
";
    std::fs::write(dir.path().join("o.yaml"), yaml).unwrap();
    let e = Organism::builder()
        .load(&dir.path().join("o.yaml"))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains(
            "listener `a2`: key `model`: tenant `acme` may use only small (tenants.acme.models)"
        ),
        "{e}"
    );
    assert!(
        e.contains("tenant `acme` may have at most 1 llm listeners (tenants.acme.max_llm_agents)"),
        "{e}"
    );
    assert!(
        e.contains("tenants.beta.models") && e.contains("no model named `nope`"),
        "{e}"
    );
}

#[tokio::test]
async fn every_listeners_work_is_in_the_usage_account_and_outlives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    // Some CPU time a call, then nothing sent; a call on an odd goal fails after it.
    std::fs::write(
        dir.path().join("busy.lua"),
        "function handle(p, meta)\n  local n = 0\n  for i = 1, 300000 do n = n + i % 7 end\n  if p.goal == '1' or p.goal == '3' then error('odd goal') end\n  return nil\nend\n",
    )
    .unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        "organism: {name: work, store: data.db}
listeners:
  - {name: busy, description: counts, kind: lua, script: busy.lua, schema: p.xsd, accepts: [Task], tenant: acme}
  - {name: worker, description: does the steps, kind: native, handler: sink, schema: p.xsd, accepts: [Plan]}
",
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    for i in 0..5 {
        let r = inject(&o, "busy", &format!("<Task><goal>{i}</goal></Task>"), None);
        settle(&o, &r.thread_id).await;
    }
    // Two of the five calls failed: each is still one message handled, not two.
    let busy = o.agent("busy").unwrap();
    assert_eq!((busy.handled, busy.errors), (5, 2));
    // The account is taken at stop too.
    o.stop().await;
    drop(o);
    let o = Organism::builder().load(&path).unwrap();
    let server = serve(&o).await;
    let url = format!(
        "http://{}/api/v1/usage?group_by=tenant,listener,model",
        server.local_addr()
    );
    let body: Value = http_get(url).await.unwrap().json().await.unwrap();
    let items = body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{body}");
    let row = &items[0];
    assert_eq!(
        (
            &row["tenant"],
            &row["listener"],
            &row["model"],
            &row["messages"]
        ),
        (&json!("acme"), &json!("busy"), &Value::Null, &json!(5)),
        "{body}"
    );
    assert_eq!(row["calls"], 0);
    assert!(row["cpu_ms"].as_u64().unwrap() >= 1, "{body}");
    assert!(
        row["handler_ms"].as_u64().unwrap() >= row["cpu_ms"].as_u64().unwrap(),
        "{body}"
    );
    server.shutdown().await;
    o.stop().await;
}
