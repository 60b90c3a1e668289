//! What the pump's benches share: the three-hop chain they measure, and the runtime they
//! run it on.

use agentserver::Organism;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="Note" type="xs:string"/></xs:schema>"#;

/// The chain a → b → c of native handlers (forward, forward, sink), XSD-validated at every
/// hop, with `store` (`memory` or a file name in `dir`). Call it inside a Tokio runtime.
pub fn chain(dir: &std::path::Path, store: &str) -> Organism {
    std::fs::write(dir.join("t.xsd"), XSD).expect("xsd");
    let yaml = format!(
        "organism: {{ name: bench, store: {store} }}
listeners:
  - {{ name: a, description: a, kind: native, handler: forward, schema: t.xsd, config: {{ to: b }} }}
  - {{ name: b, description: b, kind: native, handler: forward, schema: t.xsd, config: {{ to: c }} }}
  - {{ name: c, description: c, kind: native, handler: sink, schema: t.xsd }}
"
    );
    let path = dir.join(format!("{}.yaml", store.replace(['/', '.'], "_")));
    std::fs::write(&path, yaml).expect("yaml");
    Organism::builder().load(&path).expect("organism")
}

/// The runtime the chain runs on: two workers, as on the two-core machine it is measured on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
