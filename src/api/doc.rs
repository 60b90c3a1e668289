//! The OpenAPI document, finished: what utoipa's derives cannot say, added to the JSON, and
//! rendered once for the process, when it is first asked for.

use std::sync::{Mutex, OnceLock};

use utoipa::openapi::OpenApi;

/// The document as served, rendered by the first server of the process asked for it.
static RENDERED: OnceLock<String> = OnceLock::new();

/// What utoipa gathered from the routes (once a process, [`super::routes`]), until it is
/// rendered.
static GATHERED: Mutex<Option<OpenApi>> = Mutex::new(None);

/// Keeps what utoipa gathered from the routes, for the rendering.
pub(super) fn gathered(spec: OpenApi) {
    *crate::sync::lock(&GATHERED) = Some(spec);
}

/// The document's JSON text. It depends on the code alone, so one rendering serves every
/// server of the process; rendering it (to JSON, with what [`super::auth::document`],
/// [`links`] and [`label_rules`] add) costs about 5 ms of CPU, which a start does not pay.
pub(super) fn text() -> &'static str {
    RENDERED.get_or_init(|| {
        let spec = crate::sync::lock(&GATHERED).take();
        spec.and_then(|spec| serde_json::to_value(&spec).ok())
            .map(super::auth::document)
            .map(links)
            .map(label_rules)
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| "{}".into())
    })
}

/// Every `labels` map of the document states the label rules a schema can: its keys'
/// form (not under `agentserver.`), at most 16, and values that always fit in 256 bytes.
pub(super) fn label_rules(mut doc: serde_json::Value) -> serde_json::Value {
    if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
        // A thread as shown holds the server's labels too; the rules are a client's.
        for (_, schema) in schemas.iter_mut().filter(|(name, _)| *name != "Thread") {
            let Some(labels) = schema
                .get_mut("properties")
                .and_then(|p| p.get_mut("labels"))
            else {
                continue;
            };
            if labels.get("additionalProperties").is_some() {
                labels["propertyNames"] = serde_json::json!({"type": "string", "pattern": "^(?!agentserver\\.)[a-z0-9_.-]{1,64}$"});
                labels["maxProperties"] = serde_json::json!(crate::threads::MAX_LABELS);
                labels["additionalProperties"]["maxLength"] = serde_json::json!(64);
            }
        }
    }
    doc
}

/// Where one operation's answer feeds another (OpenAPI `links`): an inject's thread.
pub(super) fn links(mut doc: serde_json::Value) -> serde_json::Value {
    let thread = |op: &str| {
        serde_json::json!({
            "operationId": op,
            "parameters": {"id": "$response.body#/thread_id"},
        })
    };
    for status in ["200", "202"] {
        let answer = &mut doc["paths"]["/api/v1/inject"]["post"]["responses"][status];
        if answer.is_object() {
            answer["links"] = serde_json::json!({
                "thread": thread("get_thread"),
                "thread_messages": thread("thread_messages"),
            });
        }
    }
    doc
}
