//! The hostile-script suite: every case fails its own message with a precise reason and leaves
//! the organism, the listener and other listeners healthy. Real Luau, real pump.

use crate::common::*;
use agentserver::threads::{MessageStatus, ThreadStatus};
use agentserver::Organism;

const GOOD: &str = r#"
function handle(payload, meta)
  return { to = meta.from, type = "Note", payload = string.upper(payload) }
end
"#;

struct Lab {
    organism: Organism,
    _dir: tempfile::TempDir,
}

/// An organism with `evil` (the hostile script) and `good` (upper-cases a note back).
fn lab(evil: &[u8], limits: &str) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    std::fs::write(dir.path().join("evil.lua"), evil).unwrap();
    std::fs::write(dir.path().join("good.lua"), GOOD).unwrap();
    let yaml = format!(
        "organism: {{ name: lab, store: memory }}
listeners:
  - {{ name: evil, description: hostile, kind: lua, script: evil.lua, schema: t.xsd, accepts: [Note], limits: {limits} }}
  - {{ name: good, description: upper-cases, kind: lua, script: good.lua, schema: t.xsd, accepts: [Note] }}
"
    );
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, yaml).unwrap();
    let organism = Organism::builder().load(&path).expect("builds");
    Lab {
        organism,
        _dir: dir,
    }
}

/// Runs the hostile case; returns the failed message's error.
async fn attack(evil: &str, limits: &str) -> (Lab, String) {
    let lab = lab(evil.as_bytes(), limits);
    let t = inject(&lab.organism, "evil", "<Note>hi</Note>", None);
    assert_eq!(
        settle(&lab.organism, &t.thread_id).await,
        ThreadStatus::Error
    );
    let log = messages(&lab.organism, &t.thread_id);
    assert_eq!(log[0].status, MessageStatus::Failed);
    let error = log[0].error.clone().unwrap_or_default();
    assert!(error.contains("handler of `evil` failed: lua"), "{error}");
    (lab, error)
}

/// The organism still works: `good` answers, and `evil` still takes messages.
async fn healthy(lab: &Lab) {
    let t = inject(&lab.organism, "good", "<Note>still here</Note>", None);
    assert_eq!(
        settle(&lab.organism, &t.thread_id).await,
        ThreadStatus::Completed
    );
    let log = messages(&lab.organism, &t.thread_id);
    assert_eq!(&*log[1].payload_xml, "<Note>STILL HERE</Note>");
    let again = inject(&lab.organism, "evil", "<Note>again</Note>", None);
    settle(&lab.organism, &again.thread_id).await;
    assert_ne!(
        messages(&lab.organism, &again.thread_id)[0].status,
        MessageStatus::Pending
    );
}

const TIGHT: &str = "{ cpu_ms: 50, memory_mb: 8 }";

async fn case(script: &str, expect: &[&str]) {
    let (lab, error) = attack(script, TIGHT).await;
    assert!(
        expect.iter().any(|e| error.contains(e)),
        "expected one of {expect:?} in: {error}"
    );
    healthy(&lab).await;
}

#[tokio::test]
async fn io_open_is_unreachable() {
    case(
        "function handle(p, m) io.open('/etc/passwd') end",
        &["lua runtime", "io"],
    )
    .await;
}

#[tokio::test]
async fn os_execute_is_unreachable() {
    case(
        "function handle(p, m) os.execute('touch /tmp/pwned') end",
        &["lua runtime"],
    )
    .await;
}

#[tokio::test]
async fn require_is_unreachable() {
    case("function handle(p, m) require('os') end", &["lua runtime"]).await;
}

#[tokio::test]
async fn loadstring_and_load_are_unreachable() {
    case(
        "function handle(p, m) loadstring('return 1')() end",
        &["lua runtime"],
    )
    .await;
    case(
        "function handle(p, m) load('return 1')() end",
        &["lua runtime"],
    )
    .await;
    case(
        "function handle(p, m) load('\\27Lua')() end",
        &["lua runtime"],
    )
    .await;
}

#[test]
fn a_bytecode_script_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    std::fs::write(dir.path().join("evil.lua"), b"\x1bLua\x00\x01\x02garbage").unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        "organism: { name: lab, store: memory }\nlisteners:\n  - { name: evil, description: x, kind: lua, script: evil.lua, schema: t.xsd }\n",
    )
    .unwrap();
    let errs = agentserver::config::load_file(
        &path,
        agentserver::config::Known {
            handlers: &[],
            check_script: agentserver::lua::check_syntax,
        },
    )
    .unwrap_err()
    .0;
    assert!(errs[0].message.contains("does not compile"), "{errs:#?}");
}

#[tokio::test]
async fn getfenv_setfenv_and_debug_are_unreachable() {
    case(
        "function handle(p, m) getfenv(1).x = 1 end",
        &["lua runtime"],
    )
    .await;
    case("function handle(p, m) setfenv(1, {}) end", &["lua runtime"]).await;
    case(
        "function handle(p, m) return debug.traceback() end",
        &["lua runtime"],
    )
    .await;
}

#[tokio::test]
async fn string_methods_cannot_be_poisoned_for_another_listener() {
    case(
        "function handle(p, m) getmetatable('').__index.upper = function() return 'pwned' end end",
        &["lua runtime"],
    )
    .await;
    case(
        "function handle(p, m) string.upper = function() return 'pwned' end end",
        &["lua runtime"],
    )
    .await;
    // `healthy` checked that `good` still upper-cases with the real string.upper.
}

#[tokio::test]
async fn an_infinite_loop_hits_the_cpu_budget() {
    case(
        "function handle(p, m) while true do end end",
        &["lua cpu: cpu budget of 50 ms exceeded"],
    )
    .await;
}

#[tokio::test]
async fn an_infinite_loop_in_a_coroutine_hits_the_cpu_budget() {
    case(
        "function handle(p, m) local co = coroutine.create(function() while true do end end) coroutine.resume(co) return nil end",
        &["lua cpu"],
    )
    .await;
}

#[tokio::test]
async fn an_infinite_loop_under_pcall_still_fails_the_message() {
    case(
        "function handle(p, m) for i = 1, 10 do pcall(function() while true do end end) end return nil end",
        &["lua cpu"],
    )
    .await;
}

#[tokio::test]
async fn a_pathological_pattern_is_stopped_inside_the_matcher() {
    // O(n^2) backtracking inside C: Luau's matcher calls the VM interrupt, so the CPU budget
    // stops it there. (Whatever the interrupt cannot reach, the wall-clock watchdog covers;
    // see the unit test in src/lua/mod.rs.)
    case(
        "function handle(p, m) local s = string.rep('a', 150000) return { xml = tostring(s:find('^.-.-b')) } end",
        &["lua cpu: cpu budget of 50 ms exceeded"],
    )
    .await;
}

#[tokio::test]
async fn memory_bombs_hit_the_memory_cap() {
    case(
        "function handle(p, m) local s = string.rep('x', 1e9) end",
        &["lua memory: memory limit of 8 MB exceeded"],
    )
    .await;
    case(
        "function handle(p, m) local t = {} for i = 1, 1e8 do t[i] = {i} end end",
        &["lua memory", "lua cpu"],
    )
    .await;
}

#[tokio::test]
async fn deep_recursion_fails_cleanly() {
    case(
        "local function f(n) return f(n + 1) + 1 end function handle(p, m) f(1) end",
        &["stack overflow", "lua memory", "lua cpu"],
    )
    .await;
}

#[tokio::test]
async fn a_huge_output_is_refused() {
    case(
        "function handle(p, m) return { to = m.from, type = 'Note', payload = string.rep('x', 2000000) } end",
        &["lua output", "over the limit"],
    )
    .await;
}

#[tokio::test]
async fn a_killed_thread_interrupts_its_running_script() {
    let lab = lab(
        b"function handle(p, m) while true do end end",
        "{ cpu_ms: 5000, memory_mb: 8 }",
    );
    let t = inject(&lab.organism, "evil", "<Note>spin</Note>", None);
    until(&lab.organism, || {
        lab.organism.agent("evil").unwrap().state == agentserver::events::AgentState::Processing
    })
    .await;
    lab.organism.control().kill_thread(&t.thread_id).unwrap();
    assert_eq!(
        settle(&lab.organism, &t.thread_id).await,
        ThreadStatus::Killed
    );
    // The sandbox was interrupted, not left spinning: `evil` handles its next message (and
    // fails it by its own budget) well within the 5 s CPU budget of the killed call.
    healthy(&lab).await;
}

#[tokio::test]
async fn removed_builtins_are_unreachable_through_the_fast_path() {
    // Luau compiles calls to known builtins into fast calls that do not read the global:
    // each must fail as the missing global it is, not run.
    for call in [
        "getmetatable('')",
        "getmetatable({})",
        "setmetatable({}, {})",
        "vector.create(1, 2, 3)",
    ] {
        let script = format!(
            "function handle(p, m) local r = {call} return {{ to = m.from, type = \"Note\", payload = tostring(r) }} end"
        );
        case(&script, &["lua runtime", "attempt to"]).await;
    }
}

#[tokio::test]
async fn a_huge_error_text_is_cut_to_max_error_bytes_saying_so() {
    let (lab, error) = attack(
        "function handle(p, m) error(string.rep('E', 1000000)) end",
        "{ memory_mb: 64 }",
    )
    .await;
    assert!(error.len() <= 4096, "{} bytes", error.len());
    assert!(
        error.contains("bytes cut]"),
        "{}",
        &error[error.len() - 60..]
    );
    for t in lab.organism.threads().list() {
        let e = t.error.unwrap_or_default();
        assert!(e.len() <= 4096, "the thread's error: {} bytes", e.len());
    }
    healthy(&lab).await;
}

#[tokio::test]
async fn one_large_string_many_times_over_hits_the_memory_cap_on_the_host_side_too() {
    // 30,000 references to one 1 MB string: about 1 MB inside Lua, 30 GB once written
    // out (which would take the machine down were the copies not counted as they are made).
    let many = "local s = string.rep('x', 1000000) local t = {} for i = 1, 30000 do t[i] = s end";
    let (lab, error) = attack(
        &format!("function handle(p, m) {many} return {{ to = m.from, type = 'Note', payload = json.encode(t) }} end"),
        "{ memory_mb: 8, cpu_ms: 10000 }",
    )
    .await;
    assert!(error.contains("lua memory"), "{error}");
    healthy(&lab).await;
    let (lab, error) = attack(
        &format!(
            "function handle(p, m) {many} return {{ to = m.from, type = 'Note', payload = t }} end"
        ),
        "{ memory_mb: 8, cpu_ms: 10000 }",
    )
    .await;
    assert!(error.contains("lua memory"), "{error}");
    healthy(&lab).await;
}
