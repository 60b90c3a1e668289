use super::*;
use crate::listener::Meta;
use crate::xml::{normalize_payload, XmlLimits};

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="Note" type="xs:string"/></xs:schema>"#;

fn handler(dir: &std::path::Path, script: &str, limits: &str) -> (LuaHandler, Arc<Schema>) {
    std::fs::write(dir.join("t.xsd"), XSD).unwrap();
    std::fs::write(dir.join("s.lua"), script).unwrap();
    let yaml = format!(
        "organism: {{ name: u, store: memory }}\nlisteners:\n  - {{ name: l, description: x, kind: lua, script: s.lua, schema: t.xsd, limits: {limits} }}\n"
    );
    let config = crate::config::load_str(
        &yaml,
        "u.yaml",
        dir,
        crate::config::Known {
            handlers: &[],
            check_script: check_syntax,
        },
    )
    .unwrap();
    let h = LuaHandler::build(&config.listeners[0], &config, Arc::new(EventHub::new(16))).unwrap();
    (h, config.listeners[0].accepts[0].1.clone())
}

fn delivery(schema: &Schema, text: &str) -> Delivery {
    let payload = schema
        .validate(
            normalize_payload(&format!("<Note>{text}</Note>"), &XmlLimits::default()).unwrap(),
        )
        .unwrap();
    Delivery {
        meta: Meta {
            thread_id: Arc::from("t"),
            message_id: Arc::from("m"),
            from: Arc::from("api"),
            own_name: crate::config::ListenerName::new("l"),
            payload_type: payload.payload_type().clone(),
            approval: None,
            settings: None,
        },
        payload,
    }
}

#[tokio::test]
async fn the_watchdog_fails_a_call_the_interrupt_cannot_reach_and_replaces_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let script = "function handle(p, m) if p == 'block' then __test_block(3000) end return { to = m.from, type = 'Note', payload = p } end";
    let (h, schema) = handler(dir.path(), script, "{ cpu_ms: 10, memory_mb: 8 }");
    let err = h.handle(delivery(&schema, "block")).await.unwrap_err();
    assert!(
        err.0
            .starts_with("lua timeout: the call ran past the 1040 ms watchdog"),
        "{}",
        err.0
    );
    assert_eq!(h.stats().errors(FailKind::Timeout), 1);
    // A replacement sandbox serves the next call while the stuck one is still blocked.
    let out = h.handle(delivery(&schema, "next")).await.unwrap();
    assert_eq!(out[0].payload, "<Note>next</Note>");
}

#[tokio::test]
async fn a_payload_that_takes_the_state_over_its_memory_limit_fails_the_call() {
    // The payload's conversion into Lua runs with the limit lifted (see
    // `Sandbox::unlimited`); it still counts. `held` keeps the previous payload, so the
    // second 600 kB one takes the 1 MB state over its limit before the script runs (which
    // would allocate nothing).
    let dir = tempfile::tempdir().unwrap();
    let (h, schema) = handler(
        dir.path(),
        "function handle(p, m) held = p end",
        "{ cpu_ms: 1000, memory_mb: 1 }",
    );
    // (Two different strings: Luau keeps one copy of equal ones.)
    h.handle(delivery(&schema, &"x".repeat(600_000)))
        .await
        .unwrap();
    let err = h
        .handle(delivery(&schema, &"y".repeat(600_000)))
        .await
        .unwrap_err();
    assert_eq!(err.0, "lua memory: memory limit of 1 MB exceeded");
    assert_eq!(h.stats().errors(FailKind::Memory), 1);
    // The limit is in force again, and the state serves the next call.
    h.handle(delivery(&schema, "small")).await.unwrap();
}

#[tokio::test]
async fn a_failed_reload_keeps_the_old_script_and_a_good_one_swaps_it() {
    let dir = tempfile::tempdir().unwrap();
    let (h, schema) = handler(
        dir.path(),
        "function handle(p, m) return { to = m.from, type = 'Note', payload = 'v1' } end",
        "{}",
    );
    std::fs::write(dir.path().join("s.lua"), "function handle(p, m) return {").unwrap();
    assert!(h.reload_script().unwrap_err().contains("does not compile"));
    std::fs::write(
        dir.path().join("s.lua"),
        "function init(c) error('no') end function handle() end",
    )
    .unwrap();
    assert!(h.reload_script().unwrap_err().contains("init failed"));
    assert_eq!(
        h.handle(delivery(&schema, "x")).await.unwrap()[0].payload,
        "<Note>v1</Note>"
    );
    std::fs::write(
        dir.path().join("s.lua"),
        "function handle(p, m) return { to = m.from, type = 'Note', payload = 'v2' } end",
    )
    .unwrap();
    h.reload_script().unwrap();
    assert_eq!(
        h.handle(delivery(&schema, "x")).await.unwrap()[0].payload,
        "<Note>v2</Note>"
    );
}

#[tokio::test]
async fn a_replaced_pool_answers_its_queued_calls_then_its_sandbox_threads_end() {
    let dir = tempfile::tempdir().unwrap();
    let script = |tag: &str| {
        format!(
            "function handle(p, m) if p == 'block' then __test_block(300) end \
             return {{ to = m.from, type = 'Note', payload = '{tag}' }} end"
        )
    };
    let (h, schema) = handler(dir.path(), &script("v1"), "{}");
    let old = h.0.current().queue.clone();
    assert!(old.serving.load(Ordering::SeqCst) > 0);
    // One call holds the sandbox, the next waits in the queue; then the script is replaced.
    let running = h.handle(delivery(&schema, "block"));
    let queued = h.handle(delivery(&schema, "x"));
    std::fs::write(dir.path().join("s.lua"), script("v2")).unwrap();
    h.reload_script().unwrap();
    assert_eq!(running.await.unwrap()[0].payload, "<Note>v1</Note>");
    assert_eq!(queued.await.unwrap()[0].payload, "<Note>v1</Note>");
    assert_eq!(
        h.handle(delivery(&schema, "x")).await.unwrap()[0].payload,
        "<Note>v2</Note>"
    );
    crate::testing::wait_until_async("the replaced pool's sandbox threads to end", || async {
        old.serving.load(Ordering::SeqCst) == 0
    })
    .await;
}

#[test]
fn init_and_the_top_level_are_bounded_by_the_cpu_limit() {
    let limits = crate::config::LuaLimits {
        cpu_ms: 50,
        memory_mb: 16,
    };
    for (script, says) in [
        (
            "function init(c) while true do end end\nfunction handle(p, m) end",
            "init failed",
        ),
        (
            "while true do end\nfunction handle(p, m) end",
            "top level failed",
        ),
    ] {
        let e = sandbox::Sandbox::new("l", script, &serde_json::json!({}), limits)
            .err()
            .unwrap_or_else(|| panic!("{script} built"));
        assert!(e.contains(says) && e.contains("cpu"), "{script}: {e}");
    }
}
