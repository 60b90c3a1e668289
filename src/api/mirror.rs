//! The organism's events mirrored to NATS JetStream with this API's frames, for gateways
//! (`agentserver gateway`) and `restore`.

use super::{auth, frame, view, ws};
use crate::Organism;

/// Mirrors the organism's events to NATS JetStream (with `organism.nats`, unless
/// `mirror_events: false`), each with its `/ws` and `/ws/messages` frames as this API
/// renders them, and its `connected` snapshot every second, so a gateway serves the same
/// frames; runs until `stop` is cancelled, then sends what the organism published before
/// that. Returns at once without `organism.nats`.
pub async fn mirror_events(
    organism: Organism,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(), String> {
    let config = organism.config();
    let Some(nats) = config.nats.clone().filter(|n| n.mirror_events) else {
        return Ok(());
    };
    let link =
        crate::nats::Link::connect(&nats, &format!("agentserver mirror {}", config.name)).await?;
    drop(config);
    let hub = organism.event_hub();
    let snapshots = crate::nats::mirror::mirror_snapshots(
        link.clone(),
        hub.clone(),
        {
            let organism = organism.clone();
            move |seq| {
                let (agents, threads) = ws::snapshot_lists(&organism, &auth::Scope::default());
                let tenants: std::collections::BTreeMap<String, String> = organism
                    .config()
                    .listeners
                    .iter()
                    .filter_map(|l| Some((l.name.to_string(), l.tenant.clone()?)))
                    .collect();
                let open = crate::threads::InputFilter {
                    status: Some(crate::threads::InputStatus::Open),
                    ..Default::default()
                };
                let page =
                    crate::threads::Page::new(Some(crate::nats::mirror::SNAPSHOT_INPUTS), None);
                // A summary of each: a gateway shows what waits, not the payloads.
                let inputs: Vec<serde_json::Value> = organism
                    .inputs()
                    .list(&open, page)
                    .map(|p| p.items)
                    .unwrap_or_default()
                    .iter()
                    .map(super::inputs::summary)
                    .collect();
                serde_json::to_vec(&serde_json::json!({
                    "seq": seq,
                    "organism": view::Organism::from(organism.info()),
                    "agents": agents,
                    "threads": threads,
                    "tenants": tenants,
                    "inputs": inputs,
                }))
                .ok()
                .map(Into::into)
            }
        },
        stop.clone(),
    );
    let events = crate::nats::mirror::mirror(
        link,
        hub,
        move |ev| crate::nats::mirror::Frames {
            frame: frame::event_frame(ev, &organism).map(|f| f.as_str().to_string()),
            message_frame: frame::message_frame(ev, &organism).map(|f| f.as_str().to_string()),
        },
        nats.mirror_deltas,
        stop,
    );
    tokio::join!(snapshots, events);
    Ok(())
}
