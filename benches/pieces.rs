//! The hot pieces one at a time: envelope parse, payload read + XSD validation, XML → typed
//! JSON, JSON → XML in schema order, routing (to a named listener and broadcast), event fan-out
//! to subscribers, and the store's batched insert. (The XML ↔ Lua bridge is `benches/lua.rs`.)
//!
//! Run: `cargo bench --bench pieces`

use std::sync::Arc;

use agentserver::events::{EventHub, EventKind};
use agentserver::schema::Schema;
use agentserver::store::Store;
use agentserver::threads::{MessageRecord, MessageStatus};
use agentserver::time::Timestamp;
use agentserver::xml::{normalize_payload, parse_envelope, PayloadType, XmlLimits};
use agentserver::Organism;
use criterion::{criterion_group, BatchSize, Criterion, Throughput};

/// The allocator the `agentserver` binary uses, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Order"><xs:complexType><xs:sequence>
    <xs:element name="customer" type="xs:string"/>
    <xs:element name="line" maxOccurs="unbounded"><xs:complexType><xs:sequence>
      <xs:element name="sku" type="xs:string"/><xs:element name="qty" type="xs:int"/>
    </xs:sequence></xs:complexType></xs:element>
    <xs:element name="note" type="xs:string" minOccurs="0"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;
const ORDER: &str = "<Order><customer>Ada</customer><line><sku>A-1</sku><qty>2</qty></line><line><sku>B-7</sku><qty>1</qty></line><note>leave at the door</note></Order>";

fn envelope() -> String {
    format!(
        r#"<message xmlns="https://xml-pipeline.org/ns/envelope/v1"><meta><from>api</from><to>orders</to><thread>t-1</thread></meta>{}</message>"#,
        ORDER.replacen("<Order>", "<Order xmlns=\"\">", 1)
    )
}

fn record(i: u64) -> MessageRecord {
    MessageRecord::new(
        agentserver::threads::MessageCore {
            id: Arc::from(format!("m-{i:09}")),
            thread_id: Arc::from(format!("t-{:08}", i / 4)),
            parent_id: None,
            slot_index: i % 4,
            from: Arc::from("api"),
            to: Some(Arc::from("orders")),
            payload_type: Some("Order".into()),
            payload_xml: Arc::new(ORDER.to_string()),
            origin: agentserver::threads::Origin::inject(),
            timestamp: Timestamp(1_700_000_000_000 + i),
        },
        MessageStatus::Delivered,
        None,
    )
}

fn bench(c: &mut Criterion) {
    let limits = XmlLimits::default();
    let schema = Schema::compile("bench", XSD).expect("schema");
    let mut g = c.benchmark_group("pieces");
    g.throughput(Throughput::Elements(1));

    let env = envelope();
    g.bench_function("envelope_parse", |b| {
        b.iter(|| parse_envelope(&env, &limits).expect("envelope"))
    });
    g.bench_function("payload_read_and_validate", |b| {
        b.iter(|| {
            let p = normalize_payload(ORDER, &limits).expect("payload");
            schema.validate(p).expect("valid")
        })
    });
    g.bench_function("xml_to_typed_json", |b| {
        b.iter(|| schema.payload_to_json(ORDER))
    });
    let json = schema.payload_to_json(ORDER);
    g.bench_function("json_to_xml_in_schema_order", |b| {
        b.iter(|| schema.json_to_payload("Order", &json).expect("xml"))
    });

    // Routing one output (SPEC §6) in a running organism of ten listeners: to a named
    // listener, and broadcast by payload type to the eight that accept it.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let _in_runtime = rt.enter();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("t.xsd"), XSD).expect("xsd");
    let mut yaml = String::from("organism: { name: routing, store: memory }\nlisteners:\n");
    yaml.push_str("  - { name: a, description: a, kind: native, handler: sink, schema: t.xsd, accepts: [Order] }\n");
    yaml.push_str("  - { name: b, description: b, kind: native, handler: sink, schema: t.xsd, accepts: [Order] }\n");
    for i in 0..8 {
        yaml.push_str(&format!("  - {{ name: s{i}, description: s, kind: native, handler: sink, fields: {{ Copy: {{ text: string }} }} }}\n"));
    }
    std::fs::write(dir.path().join("o.yaml"), yaml).expect("yaml");
    let organism = Organism::builder()
        .load(&dir.path().join("o.yaml"))
        .expect("organism");
    let (order, copy) = (PayloadType::parse("Order"), PayloadType::parse("Copy"));
    g.bench_function("route_to_named_listener", |b| {
        b.iter(|| {
            organism
                .route_preview("a", "api", Some("b"), &order)
                .expect("route")
        })
    });
    g.bench_function("route_broadcast_to_8", |b| {
        b.iter(|| {
            organism
                .route_preview("a", "api", None, &copy)
                .expect("route")
        })
    });

    // One event published and received by each of 50 subscribers.
    let hub = EventHub::new(1 << 16);
    let mut subscribers: Vec<_> = (0..50).map(|_| hub.subscribe()).collect();
    g.bench_function("event_fan_out_to_50", |b| {
        b.iter(|| {
            hub.publish(EventKind::Error {
                thread_id: None,
                agent: None,
                error: "x".into(),
            });
            for s in &mut subscribers {
                let _ = s.try_recv();
            }
        })
    });

    // Messages through the store's batched writer, committed (flush waits for the commit).
    // The writer gathers for up to one batch window (20 ms) when it has less than a full
    // batch, so 20,000 per iteration keeps that under ~15 % of the figure.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("bench.db")).expect("store");
    let mut n = 0u64;
    const BATCH: u64 = 20_000;
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("store_insert_20000_committed", |b| {
        b.iter_batched(
            || {
                let start = n;
                n += BATCH;
                start
            },
            |start| {
                for i in start..start + BATCH {
                    store.record(i + 1, &EventKind::Message { message: record(i) });
                }
                store.flush(start + BATCH);
            },
            BatchSize::SmallInput,
        )
    });

    // What checking an API key adds to a request: the whole check a request's
    // `Authorization: Bearer ask_…` gets (the header read, the key's row from the cache, the
    // stamp looked at, the SHA-256 of the secret compared in constant time, the principal).
    let auth_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        auth_dir.path().join("t.xsd"),
        r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="Note" type="xs:string"/></xs:schema>"#,
    )
    .expect("xsd");
    let file = auth_dir.path().join("o.yaml");
    std::fs::write(
        &file,
        "organism: { name: bench, store: data.db }\nauth: { methods: [keys] }\nlisteners:\n  - { name: a, description: a, kind: native, handler: sink, schema: t.xsd, accepts: [Note] }\n",
    )
    .expect("organism");
    let config = Organism::builder().load_config(&file).expect("config");
    let auth = agentserver::access::Authenticator::new(&config)
        .expect("auth")
        .expect("keys on");
    let (key, row) =
        agentserver::access::new_key("bench", agentserver::access::Role::Operator, None, None)
            .expect("key");
    auth.keys().expect("keys").add(&row).expect("add");
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::AUTHORIZATION,
        format!("Bearer {key}").parse().expect("header"),
    );
    g.throughput(Throughput::Elements(1));
    g.bench_function("api_key_check", |b| {
        b.iter(|| agentserver::api::auth::authenticate(&auth, &headers).expect("a good key"))
    });
    g.finish();
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
