//! The OpenAPI document, finished: what utoipa's derives cannot say, added to the JSON.

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
