//! A Lua `handle` round trip (XML → typed table → script → table → XML in schema order),
//! beside the cost of a raw mlua call into the same kind of state, measured in the same run.
//!
//! Run: `cargo bench --bench lua`

use std::sync::Arc;

use agentserver::config::{self, ListenerName};
use agentserver::events::EventHub;
use agentserver::listener::{Delivery, Handler, Meta};
use agentserver::lua::LuaHandler;
use agentserver::xml::{normalize_payload, XmlLimits};
use criterion::{criterion_group, Criterion, Throughput};

/// The allocator the `agentserver` binary uses, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const GREETER: &str = r#"
function handle(payload, meta)
  return {
    to = "shouter",
    payload = { message = "Hello, " .. payload.name .. "!", original_sender = meta.from },
  }
end
"#;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::write(dir.path().join("greeter.lua"), GREETER).expect("script");
    std::fs::write(
        dir.path().join("quiet.lua"),
        "function handle() return nil end",
    )
    .expect("script");
    let yaml = format!(
        "organism: {{ name: bench, store: memory }}
listeners:
  - {{ name: greeter, description: g, kind: lua, script: greeter.lua, schema: {0}/schemas/greeting.xsd, peers: [shouter] }}
  - {{ name: shouter, description: s, kind: native, handler: sink, schema: {0}/schemas/greeting-response.xsd }}
  - {{ name: quiet, description: q, kind: lua, script: quiet.lua, schema: {0}/schemas/greeting.xsd }}
",
        root.display()
    );
    let config = config::load_str(
        &yaml,
        "bench.yaml",
        dir.path(),
        config::Known {
            handlers: &["sink"],
            check_script: agentserver::lua::check_syntax,
        },
    )
    .expect("config");
    let schema = config.listeners[0].accepts[0].1.clone();
    let (handler, quiet) = {
        let _guard = rt.enter();
        let events = Arc::new(EventHub::new(1024));
        (
            LuaHandler::build(&config.listeners[0], &config, events.clone()).expect("handler"),
            LuaHandler::build(&config.listeners[2], &config, events).expect("handler"),
        )
    };
    let payload = schema
        .validate(
            normalize_payload(
                "<Greeting><name>Dan</name></Greeting>",
                &XmlLimits::default(),
            )
            .expect("normalize"),
        )
        .expect("valid");
    let delivery = Delivery {
        meta: Meta {
            thread_id: Arc::from("t"),
            message_id: Arc::from("m"),
            from: Arc::from("api"),
            own_name: ListenerName::new("greeter"),
            payload_type: payload.payload_type().clone(),
            approval: None,
            settings: None,
        },
        payload,
    };

    let mut group = c.benchmark_group("lua");
    group.bench_function("handle_round_trip", |b| {
        b.to_async(&rt).iter(|| async {
            let out = handler.handle(delivery.clone()).await.expect("handled");
            assert_eq!(out.len(), 1);
        })
    });

    // Throughput: 64 calls in flight into the one sandbox (concurrency 1), as under load; the
    // sandbox thread stays busy instead of sleeping between calls.
    group.throughput(Throughput::Elements(64));
    group.bench_function("handle_64_in_flight", |b| {
        b.to_async(&rt).iter(|| async {
            let calls = (0..64).map(|_| handler.handle(delivery.clone()));
            for out in futures_util::future::join_all(calls).await {
                assert_eq!(out.expect("handled").len(), 1);
            }
        })
    });
    group.throughput(Throughput::Elements(1));

    // The same trip with a script that returns nothing: the thread hand-off and the input
    // conversion alone.
    group.bench_function("handle_returning_nil", |b| {
        b.to_async(&rt).iter(|| async {
            let out = quiet.handle(delivery.clone()).await.expect("handled");
            assert!(out.is_empty());
        })
    });

    // The floor: a raw mlua call of a comparable function, table in, table out.
    let lua = mlua::Lua::new();
    let f: mlua::Function = lua
        .load("return function(p, m) return { to = 'shouter', payload = { message = 'Hello, ' .. p.name .. '!', original_sender = m.from } } end")
        .eval()
        .expect("function");
    group.bench_function("raw_mlua_call", |b| {
        b.iter(|| {
            let p = lua.create_table().expect("table");
            p.set("name", "Dan").expect("set");
            let m = lua.create_table().expect("table");
            m.set("from", "api").expect("set");
            let out: mlua::Table = f.call((p, m)).expect("call");
            std::hint::black_box(out);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);

/// `criterion_main!`, with the binary's allocators: mimalloc for Rust and, set first thing,
/// for libxml2 too, so the figures are the binary's.
fn main() {
    // SAFETY: first thing in the process; libxml2 has allocated nothing yet.
    unsafe { agentserver::schema::use_mimalloc_for_libxml2() };
    benches();
    Criterion::default().configure_from_args().final_summary();
}
